"""Soft actor-critic with twin critics and a learned temperature on the gorila_jax skeleton."""

from agents.sac.builder import SACBuilder
from agents.sac.config import SACConfig

__all__ = ["SACBuilder", "SACConfig"]
