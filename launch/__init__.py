"""Experiment scripts: the only place where flags exist."""
