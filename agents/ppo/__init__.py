"""PPO (clipped surrogate) on trajectory chunks, with V-trace corrections for policy lag."""

from agents.ppo.builder import PPOBuilder
from agents.ppo.config import PPOConfig

__all__ = ["PPOBuilder", "PPOConfig"]
