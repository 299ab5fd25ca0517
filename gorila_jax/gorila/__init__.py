"""Gorila mode: parameter-server shards, gradient workers, gradient compression."""
