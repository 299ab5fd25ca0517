"""DQN Q-networks (Flax linen). Compute in `dtype`, keep float32 parameters, return float32."""

from typing import Any, Sequence

import flax.linen as nn
import jax.numpy as jnp

from agents import conv
from gorila_jax import types

TORSOS = ("mlp", "nature", "impala", "minatar")
# Torsos of uint8 [C, H, W] frame stacks (Atari's layout), and of [H, W, C] grids of
# numbers (MinAtar's 0/1 channels, gymnax's layout).
STACK_TORSOS = ("nature", "impala")
GRID_TORSOS = ("minatar",)


def _dense(size: int, dtype: Any) -> nn.Dense:
    return nn.Dense(size, dtype=dtype, param_dtype=jnp.float32)


def _conv(features: int, kernel: int, stride: int, padding: str, dtype: Any) -> nn.Conv:
    # agents.conv keeps the gradient convolutions fast on CPU inside a lax.scan
    # (PPO's epochs): XLA:CPU canonicalizes them only outside loops.
    return nn.Conv(
        features,
        (kernel, kernel),
        (stride, stride),
        padding,
        dtype=dtype,
        param_dtype=jnp.float32,
        conv_general_dilated=conv.conv_general_dilated,
    )


def _images_nhwc(obs: jnp.ndarray, dtype: Any) -> jnp.ndarray:
    """uint8 [B, C, H, W] frame stacks (envpool's layout) -> [B, H, W, C] in [0, 1].

    The conversion runs on the device: observations stay uint8 (a quarter of
    float32's bytes) from the env through replay to here.
    """
    return jnp.transpose(obs, (0, 2, 3, 1)).astype(dtype) / 255.0


class NatureTorso(nn.Module):
    """The conv stack of Mnih et al. (2015): 32x8x8/4, 64x4x4/2, 64x3x3/1."""

    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, images: jnp.ndarray) -> jnp.ndarray:
        x = images
        for features, kernel, stride in ((32, 8, 4), (64, 4, 2), (64, 3, 1)):
            x = nn.relu(_conv(features, kernel, stride, "VALID", self.dtype)(x))
        return x.reshape((x.shape[0], -1))


class ImpalaTorso(nn.Module):
    """The residual torso of Espeholt et al. (2018): wider and deeper than Nature's."""

    channels: Sequence[int] = (16, 32, 32)
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, images: jnp.ndarray) -> jnp.ndarray:
        x = images
        for features in self.channels:
            x = _conv(features, 3, 1, "SAME", self.dtype)(x)
            x = nn.max_pool(x, (3, 3), strides=(2, 2), padding="SAME")
            for _ in range(2):
                block = _conv(features, 3, 1, "SAME", self.dtype)(nn.relu(x))
                block = _conv(features, 3, 1, "SAME", self.dtype)(nn.relu(block))
                x = x + block
        x = nn.relu(x)
        return x.reshape((x.shape[0], -1))


class MinAtarTorso(nn.Module):
    """Young and Tian's (2019) MinAtar torso: one 16x3x3/1 convolution on the grid."""

    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, grids: jnp.ndarray) -> jnp.ndarray:
        x = nn.relu(_conv(16, 3, 1, "VALID", self.dtype)(grids.astype(self.dtype)))
        return x.reshape((x.shape[0], -1))


def conv_features(obs: jnp.ndarray, torso: str, dtype: Any) -> jnp.ndarray:
    """A conv torso's flat features [B, F] of a batch of observations (`torso` one of
    `STACK_TORSOS` or `GRID_TORSOS`). Called inside an `nn.compact` `__call__`, whose
    submodule it makes."""
    if torso == "minatar":
        return MinAtarTorso(dtype)(obs)
    if torso == "nature":
        return NatureTorso(dtype)(_images_nhwc(obs, dtype))
    return ImpalaTorso(dtype=dtype)(_images_nhwc(obs, dtype))


class QNetwork(nn.Module):
    """Torso, ReLU layers, then a plain or dueling head (Wang et al., 2016).

    Attributes:
      num_actions: size of the discrete action set.
      hidden_sizes: widths of the ReLU layers after the torso.
      torso: "mlp" flattens observations; "nature" and "impala" take uint8
        [B, C, H, W] frame stacks, "minatar" [B, H, W, C] grids.
      dueling: Q = V + A - mean(A) instead of a single linear head.
      layer_norm: normalize each ReLU layer's input (Dense, LayerNorm, ReLU).
      dtype: compute dtype; parameters are always float32.
    """

    num_actions: int
    hidden_sizes: Sequence[int]
    torso: str = "mlp"
    dueling: bool = False
    layer_norm: bool = False
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, obs: jnp.ndarray) -> jnp.ndarray:  # obs: [B, ...] -> q: [B, A]
        x = features(obs, self.torso, self.hidden_sizes, self.layer_norm, self.dtype)
        if self.dueling:
            value = _dense(1, self.dtype)(x)
            advantage = _dense(self.num_actions, self.dtype)(x)
            q = value + advantage - advantage.mean(axis=-1, keepdims=True)
        else:
            q = _dense(self.num_actions, self.dtype)(x)
        return q.astype(jnp.float32)  # TD targets and priorities are always float32


def features(
    obs: jnp.ndarray, torso: str, hidden_sizes: Sequence[int], layer_norm: bool, dtype: Any
) -> jnp.ndarray:
    """The torso and the hidden ReLU layers, [B, ...] -> [B, hidden_sizes[-1]].

    Called inside a head's `nn.compact` `__call__`: its layers are the head's
    own submodules (named as if written there), so DQN and QR-DQN share them.
    """
    if torso == "mlp":
        x = obs.reshape((obs.shape[0], -1)).astype(dtype)
    else:
        x = conv_features(obs, torso, dtype)
    for size in hidden_sizes:
        x = _dense(size, dtype)(x)
        if layer_norm:
            x = nn.LayerNorm(dtype=dtype, param_dtype=jnp.float32)(x)
        x = nn.relu(x)
    return x


def resolve_torso(torso: str, spec: types.EnvSpec) -> str:
    """`auto` is the Nature torso for uint8 frame stacks ([C, H, W]), the MinAtar torso
    for [H, W, C] grids, else the MLP."""
    if torso != "auto":
        return torso
    if spec.image_stack:
        return "nature"
    return "minatar" if spec.grid else "mlp"


def fitting_torso(torso: str, spec: types.EnvSpec) -> str:
    """The torso `torso` resolves to for `spec`.

    Raises:
      ValueError: a conv torso on observations of another layout, saying which fits.
    """
    torso = resolve_torso(torso, spec)
    observed = f"{spec.env_id} observes {spec.observation_dtype} {list(spec.observation_shape)}"
    fits = f"use torso='{resolve_torso('auto', spec)}'"
    if torso in STACK_TORSOS and not spec.image_stack:
        raise ValueError(
            f"the {torso} torso needs uint8 image stacks [C, H, W]; {observed} ({fits})"
        )
    if torso in GRID_TORSOS and not spec.grid:
        raise ValueError(f"the {torso} torso needs [H, W, C] grids of numbers; {observed} ({fits})")
    return torso


def checked_torso(torso: str, spec: types.EnvSpec, agent: str) -> str:
    """The torso `torso` resolves to for `spec`.

    Raises:
      ValueError: `spec` has continuous actions, or `torso` does not fit its observations.
    """
    if not spec.discrete:
        raise ValueError(f"{agent} needs discrete actions; {spec.env_id} has continuous ones")
    return fitting_torso(torso, spec)


def make_network(
    spec: types.EnvSpec,
    hidden_sizes: Sequence[int],
    dueling: bool,
    torso: str = "auto",
    dtype: Any = jnp.float32,
    layer_norm: bool = False,
) -> QNetwork:
    torso = checked_torso(torso, spec, "DQN")
    return QNetwork(spec.num_actions, tuple(hidden_sizes), torso, dueling, layer_norm, dtype)
