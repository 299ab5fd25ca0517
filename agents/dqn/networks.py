"""DQN Q-networks (Flax linen). Compute in `dtype`, keep float32 parameters, return float32."""

from typing import Any, Sequence

import flax.linen as nn
import jax.numpy as jnp

from gorila_jax import types


class QNetwork(nn.Module):
    """MLP Q-network with an optional dueling head (Wang et al., 2016).

    Attributes:
      num_actions: size of the discrete action set.
      hidden_sizes: widths of the torso's ReLU layers.
      dueling: Q = V + A - mean(A) instead of a single linear head.
      dtype: compute dtype; parameters are always float32.
    """

    num_actions: int
    hidden_sizes: Sequence[int]
    dueling: bool = False
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, obs: jnp.ndarray) -> jnp.ndarray:  # obs: [B, ...] -> q: [B, A]
        dense = lambda size: nn.Dense(size, dtype=self.dtype, param_dtype=jnp.float32)  # noqa: E731
        x = obs.reshape((obs.shape[0], -1)).astype(self.dtype)
        for size in self.hidden_sizes:
            x = nn.relu(dense(size)(x))
        if self.dueling:
            value = dense(1)(x)
            advantage = dense(self.num_actions)(x)
            q = value + advantage - advantage.mean(axis=-1, keepdims=True)
        else:
            q = dense(self.num_actions)(x)
        return q.astype(jnp.float32)  # TD targets and priorities are always float32


def make_network(spec: types.EnvSpec, hidden_sizes: Sequence[int], dueling: bool) -> QNetwork:
    if not spec.discrete:
        raise ValueError(f"DQN needs discrete actions; {spec.env_id} has continuous ones")
    return QNetwork(spec.num_actions, tuple(hidden_sizes), dueling)
