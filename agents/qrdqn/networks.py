"""QR-DQN's quantile network: DQN's torsos, a head of N quantiles per action."""

from typing import Any, Sequence

import flax.linen as nn
import jax.numpy as jnp

from agents.dqn import networks as dqn_networks
from gorila_jax import types


class QuantileNetwork(nn.Module):
    """Torso, ReLU layers, then N quantiles of the return per action.

    Attributes:
      num_actions: size of the discrete action set.
      num_quantiles: N, the quantiles per action.
      hidden_sizes: widths of the ReLU layers after the torso.
      torso: "mlp", "nature" or "impala" (`agents.dqn.networks`).
      dueling: quantiles = V + A - mean over actions of A, per quantile.
      layer_norm: normalize each ReLU layer's input (Dense, LayerNorm, ReLU).
      dtype: compute dtype; parameters are always float32.
    """

    num_actions: int
    num_quantiles: int
    hidden_sizes: Sequence[int]
    torso: str = "mlp"
    dueling: bool = False
    layer_norm: bool = False
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, obs: jnp.ndarray) -> jnp.ndarray:  # obs: [B, ...] -> [B, A, N]
        x = dqn_networks.features(obs, self.torso, self.hidden_sizes, self.layer_norm, self.dtype)
        shape = (x.shape[0], self.num_actions, self.num_quantiles)
        advantage = nn.Dense(
            self.num_actions * self.num_quantiles, dtype=self.dtype, param_dtype=jnp.float32
        )(x).reshape(shape)
        if self.dueling:
            value = nn.Dense(self.num_quantiles, dtype=self.dtype, param_dtype=jnp.float32)(x)
            quantiles = value[:, None, :] + advantage - advantage.mean(axis=1, keepdims=True)
        else:
            quantiles = advantage
        return quantiles.astype(jnp.float32)  # the loss and priorities are always float32


def make_network(
    spec: types.EnvSpec,
    num_quantiles: int,
    hidden_sizes: Sequence[int],
    dueling: bool,
    torso: str = "auto",
    dtype: Any = jnp.float32,
    layer_norm: bool = False,
) -> QuantileNetwork:
    torso = dqn_networks.checked_torso(torso, spec, "QR-DQN")
    return QuantileNetwork(
        spec.num_actions, num_quantiles, tuple(hidden_sizes), torso, dueling, layer_norm, dtype
    )
