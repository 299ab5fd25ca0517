"""PPO's actor-critic network and its action distributions (categorical, diagonal Gaussian).

The network maps observations to the distribution's inputs and a value;
the distributions are pure functions of those inputs, so acting, learning
and evaluation share them.
"""

import math
from typing import Any, NamedTuple, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from agents.dqn.networks import conv_features, fitting_torso
from gorila_jax import types


class DistInputs(NamedTuple):
    """[B, A] logits (categorical), or [B, D] means and [B, D] log standard deviations."""

    loc: jax.Array
    log_scale: jax.Array  # [B, 0] for the categorical


class Categorical:
    """Discrete actions: a softmax over logits; the greedy action is the argmax."""

    def sample(self, key: jax.Array, inputs: DistInputs) -> jax.Array:
        return jax.random.categorical(key, inputs.loc).astype(jnp.int32)

    def mode(self, inputs: DistInputs) -> jax.Array:
        return jnp.argmax(inputs.loc, axis=-1).astype(jnp.int32)

    def log_prob(self, inputs: DistInputs, action: jax.Array) -> jax.Array:
        log_probs = jax.nn.log_softmax(inputs.loc)
        return jnp.take_along_axis(log_probs, action[..., None].astype(jnp.int32), -1)[..., 0]

    def entropy(self, inputs: DistInputs) -> jax.Array:
        log_probs = jax.nn.log_softmax(inputs.loc)
        return -jnp.sum(jnp.exp(log_probs) * log_probs, axis=-1)

    def to_env(self, raw_action: jax.Array) -> jax.Array:
        return raw_action


class DiagGaussian:
    """Continuous actions: an unbounded diagonal Gaussian, clipped to the bounds only for the env.

    Log-probabilities are of the unclipped sample (CleanRL's and SB3's rule),
    which actors record beside the clipped action the env received.
    """

    def __init__(self, low: Sequence[float], high: Sequence[float]):
        self._low = np.asarray(low, np.float32)
        self._high = np.asarray(high, np.float32)

    def sample(self, key: jax.Array, inputs: DistInputs) -> jax.Array:
        noise = jax.random.normal(key, inputs.loc.shape)
        return inputs.loc + jnp.exp(inputs.log_scale) * noise

    def mode(self, inputs: DistInputs) -> jax.Array:
        return inputs.loc

    def log_prob(self, inputs: DistInputs, action: jax.Array) -> jax.Array:
        z = (action - inputs.loc) * jnp.exp(-inputs.log_scale)
        per_dim = -0.5 * z**2 - inputs.log_scale - 0.5 * math.log(2 * math.pi)
        return jnp.sum(per_dim, axis=-1)

    def entropy(self, inputs: DistInputs) -> jax.Array:
        return jnp.sum(inputs.log_scale + 0.5 * math.log(2 * math.pi * math.e), axis=-1)

    def to_env(self, raw_action: jax.Array) -> jax.Array:
        return jnp.clip(raw_action, self._low, self._high)


def make_distribution(spec: types.EnvSpec) -> Categorical | DiagGaussian:
    if spec.discrete:
        return Categorical()
    return DiagGaussian(spec.action_low, spec.action_high)


def _dense(size: int, scale: float, dtype: Any) -> nn.Dense:
    # Orthogonal initialization (CleanRL, Andrychowicz et al., 2021): sqrt(2)
    # in hidden layers, 0.01 for the policy head (near-uniform first policy),
    # 1 for the value head.
    return nn.Dense(
        size,
        kernel_init=nn.initializers.orthogonal(scale),
        bias_init=nn.initializers.zeros,
        dtype=dtype,
        param_dtype=jnp.float32,
    )


class MLP(nn.Module):
    hidden_sizes: Sequence[int]
    activation: str
    dtype: Any

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        act = jnp.tanh if self.activation == "tanh" else nn.relu
        for size in self.hidden_sizes:
            x = act(_dense(size, math.sqrt(2), self.dtype)(x))
        return x


class ActorCritic(nn.Module):
    """Observations [B, ...] -> (DistInputs, values [B]), in float32 whatever the compute dtype.

    Attributes:
      num_actions: discrete actions (0 for continuous ones).
      action_size: dimensions of a continuous action (0 for discrete ones).
      hidden_sizes: MLP widths.
      torso: "mlp": separate policy and value MLPs on flat observations;
        "nature"/"impala" (uint8 [B, C, H, W] frame stacks) or "minatar" ([B, H, W, C]
        grids): a shared conv torso, then one shared ReLU MLP.
      activation: the MLP nonlinearity of the "mlp" torso.
      init_log_std: starting log standard deviation (continuous actions).
      dtype: compute dtype; parameters are float32.
    """

    num_actions: int
    action_size: int
    hidden_sizes: Sequence[int]
    torso: str = "mlp"
    activation: str = "tanh"
    init_log_std: float = 0.0
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, obs: jax.Array) -> tuple[DistInputs, jax.Array]:
        if self.torso != "mlp":
            features = conv_features(obs, self.torso, self.dtype)
            shared = MLP(self.hidden_sizes, "relu", self.dtype)(features)
            policy_x = value_x = shared
        else:
            flat = obs.reshape((obs.shape[0], -1)).astype(self.dtype)
            policy_x = MLP(self.hidden_sizes, self.activation, self.dtype, name="policy_mlp")(flat)
            value_x = MLP(self.hidden_sizes, self.activation, self.dtype, name="value_mlp")(flat)
        value = _dense(1, 1.0, self.dtype)(value_x)[:, 0].astype(jnp.float32)
        if self.num_actions:
            logits = _dense(self.num_actions, 0.01, self.dtype)(policy_x).astype(jnp.float32)
            return DistInputs(logits, jnp.zeros((obs.shape[0], 0), jnp.float32)), value
        mean = _dense(self.action_size, 0.01, self.dtype)(policy_x).astype(jnp.float32)
        log_std = self.param(
            "log_std", nn.initializers.constant(self.init_log_std), (self.action_size,)
        )
        return DistInputs(mean, jnp.broadcast_to(log_std, mean.shape)), value


def make_network(
    spec: types.EnvSpec,
    hidden_sizes: Sequence[int],
    torso: str = "auto",
    activation: str = "tanh",
    init_log_std: float = 0.0,
    dtype: Any = jnp.float32,
) -> ActorCritic:
    torso = fitting_torso(torso, spec)
    if not spec.discrete and len(spec.action_shape) != 1:
        raise ValueError(
            f"the Gaussian policy needs flat continuous actions; {spec.env_id} actions have "
            f"shape {spec.action_shape}"
        )
    action_size = 0 if spec.discrete else spec.action_shape[0]
    return ActorCritic(
        spec.num_actions, action_size, tuple(hidden_sizes), torso, activation, init_log_std, dtype
    )
