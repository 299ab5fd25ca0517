"""SAC networks (Flax linen): a Gaussian policy head and twin Q-functions.

Both compute in `dtype` with float32 parameters and return float32, so that
log-probabilities, TD targets and losses are always float32.
"""

from typing import Any, NamedTuple, Sequence

import flax.linen as nn
import jax.numpy as jnp

from gorila_jax import types


def _mlp(x: jnp.ndarray, hidden_sizes: Sequence[int], dtype: Any) -> jnp.ndarray:
    for size in hidden_sizes:
        x = nn.relu(nn.Dense(size, dtype=dtype, param_dtype=jnp.float32)(x))
    return x


class GaussianPolicy(nn.Module):
    """obs [B, O] -> (mean [B, A], log_std [B, A]) of the Gaussian before the tanh.

    log_std is squashed smoothly into [log_std_min, log_std_max] (as CleanRL
    and SpinningUp do) rather than clipped, so its gradient never vanishes.
    """

    action_dim: int
    hidden_sizes: Sequence[int]
    log_std_min: float = -5.0
    log_std_max: float = 2.0
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, obs: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
        x = _mlp(obs.astype(self.dtype), self.hidden_sizes, self.dtype)
        mean = nn.Dense(self.action_dim, dtype=self.dtype, param_dtype=jnp.float32)(x)
        raw_log_std = nn.Dense(self.action_dim, dtype=self.dtype, param_dtype=jnp.float32)(x)
        squashed = jnp.tanh(raw_log_std.astype(jnp.float32))
        log_std = self.log_std_min + 0.5 * (self.log_std_max - self.log_std_min) * (squashed + 1)
        return mean.astype(jnp.float32), log_std


class TwinCritic(nn.Module):
    """(obs [B, O], action [B, A] in [-1, 1]) -> Q-values [2, B] of two independent critics.

    Two critics and the minimum of their values in the targets counter the
    overestimation of a single one (Fujimoto et al., 2018).
    """

    hidden_sizes: Sequence[int]
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, obs: jnp.ndarray, action: jnp.ndarray) -> jnp.ndarray:
        x = jnp.concatenate([obs.astype(jnp.float32), action.astype(jnp.float32)], -1)
        x = x.astype(self.dtype)
        values = []
        for _ in range(2):
            hidden = _mlp(x, self.hidden_sizes, self.dtype)
            q = nn.Dense(1, dtype=self.dtype, param_dtype=jnp.float32)(hidden)
            values.append(q[:, 0].astype(jnp.float32))
        return jnp.stack(values)


class SACNetworks(NamedTuple):
    """The two modules of one agent; static (closed over), never part of the state."""

    policy: GaussianPolicy
    critic: TwinCritic


def make_networks(
    spec: types.EnvSpec,
    hidden_sizes: Sequence[int],
    log_std_min: float,
    log_std_max: float,
    dtype: Any = jnp.float32,
) -> SACNetworks:
    """SAC's policy and critics for `spec`.

    Raises:
      ValueError: if `spec` has discrete actions.
    """
    if spec.discrete or len(spec.action_shape) != 1:
        raise ValueError(
            f"SAC needs continuous actions of shape (A,); {spec.env_id} has "
            f"{'discrete actions' if spec.discrete else f'shape {spec.action_shape}'}"
        )
    hidden = tuple(hidden_sizes)
    policy = GaussianPolicy(spec.action_shape[0], hidden, log_std_min, log_std_max, dtype)
    return SACNetworks(policy, TwinCritic(hidden, dtype))
