"""Double DQN with n-step returns and prioritized replay on the gorila_jax skeleton."""

from agents.dqn.builder import DQNBuilder
from agents.dqn.config import DQNConfig

__all__ = ["DQNBuilder", "DQNConfig"]
