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
        if self.torso in ("nature", "impala"):
            # uint8 [B, C, H, W] frame stacks, converted on the device as DQN does.
            images = jnp.transpose(obs, (0, 2, 3, 1)).astype(self.dtype) / 255.0
            torso = dqn_networks.NatureTorso if self.torso == "nature" else dqn_networks.ImpalaTorso
            x = torso(dtype=self.dtype)(images)
        else:
            x = obs.reshape((obs.shape[0], -1)).astype(self.dtype)
        for size in self.hidden_sizes:
            x = nn.Dense(size, dtype=self.dtype, param_dtype=jnp.float32)(x)
            if self.layer_norm:
                x = nn.LayerNorm(dtype=self.dtype, param_dtype=jnp.float32)(x)
            x = nn.relu(x)
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
    if not spec.discrete:
        raise ValueError(f"QR-DQN needs discrete actions; {spec.env_id} has continuous ones")
    torso = dqn_networks.resolve_torso(torso, spec)
    if torso in ("nature", "impala") and len(spec.observation_shape) != 3:
        raise ValueError(
            f"the {torso} torso needs image stacks [C, H, W]; {spec.env_id} observations "
            f"have shape {spec.observation_shape} (use torso='mlp')"
        )
    return QuantileNetwork(
        spec.num_actions, num_quantiles, tuple(hidden_sizes), torso, dueling, layer_norm, dtype
    )
