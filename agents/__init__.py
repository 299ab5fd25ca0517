"""Agents: each folder plugs into gorila_jax through one builder."""
