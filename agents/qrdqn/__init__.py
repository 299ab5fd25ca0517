"""QR-DQN (Dabney et al., 2018): distributional double DQN with quantile regression.

The tutorial agent of docs/adding_an_agent.md: it plugs into the skeleton
through `gorila_jax.builder.AgentBuilder` alone and reuses DQN's replay,
adder, optimizer and exploration, changing only the network head, the loss
and how the policy reads the head.
"""

from agents.qrdqn.builder import QRDQNBuilder
from agents.qrdqn.config import QRDQNConfig

__all__ = ["QRDQNBuilder", "QRDQNConfig"]
