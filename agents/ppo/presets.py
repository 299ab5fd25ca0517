"""PPO's named presets, registered under `--agent=ppo` in agents/registry.py."""

import dataclasses
from typing import Any

from agents import ppo

PPO_PRESETS = (
    "default",
    "cartpole",
    "simple",
    "medium",
    "hard",
    "pendulum",
    "mujoco",
    "mpe",
    "minatar",
    "minatar_gymnax",
)
_ATARI_CHANGES = (
    "CleanRL's Atari PPO: Nature torso, 128-step chunks, 4 epochs x 4 minibatches, clip 0.1, "
    "lr 2.5e-4, 10M env steps, pull every {} actor steps"
)
_CONTINUOUS_CHANGES = (
    "CleanRL's continuous PPO: 64x64 MLP, 256-step chunks, 10 epochs x 8 minibatches, "
    "lr 3e-4, normalized observations, {} env steps"
)
# preset -> (env family, what it changes), for `--list_presets`.
PPO_PRESET_INFO = {
    "default": ("any", "PPOConfig() as it is"),
    "cartpole": (
        "CartPole",
        "64x64 MLP, 64-step chunks, batch of 8 chunks, 4 epochs x 8 minibatches, lr 1e-3, "
        "2 actors, 200k env steps",
    ),
    "simple": ("Atari (Pong)", _ATARI_CHANGES.format(10)),
    "medium": ("Atari (Breakout)", _ATARI_CHANGES.format(5)),
    "hard": ("Atari (Montezuma's Revenge)", _ATARI_CHANGES.format(1)),
    "pendulum": ("Pendulum", _CONTINUOUS_CHANGES.format("500k")),
    "mujoco": ("MuJoCo", _CONTINUOUS_CHANGES.format("1M")),
    "mpe": (
        "MPE (one shared role)",
        "cartpole's with 50-step chunks (2 episodes), 10 epochs x 4 minibatches, lr 5e-4, "
        "300k agent steps",
    ),
    "minatar": (
        "MinAtar (gymnax), [10, 10, C] grids",
        "one 16x3x3 conv then 128 units, 128-step chunks, batch of 8 chunks, 4 epochs x 8 "
        "minibatches, lr 3e-4, clip 0.2, entropy 0.01, 1M env steps",
    ),
    "minatar_gymnax": (
        "MinAtar (gymnax), [10, 10, C] grids",
        "gymnax-blines' MinAtar PPO (its checkpoints' settings): 256x256 ReLU MLPs on the "
        "flattened grid, 64 envs x 128 steps, 4 epochs x 8 minibatches, lr 5e-4, gamma "
        "0.999, clip 0.2 (value too), 10M env steps",
    ),
}

# The brief's parameter-pull interval by Atari difficulty (DESIGN.md section 4).
# PPO's batch is counted in trajectory chunks, not transitions, so it keeps its
# own: 8 chunks of 128 steps per actor (CleanRL's 8 envs x 128 steps).
_ATARI_PULL_INTERVAL = {"simple": 10, "medium": 5, "hard": 1}


def _cartpole() -> tuple[ppo.PPOConfig, dict[str, Any]]:
    # Tuned for time to solve CartPole-v1 on 2 CPU cores; see the README
    # ("PPO") for measured runs. Greedy evaluation (argmax) reaches 500 well
    # before the stochastic training return does.
    config = dataclasses.replace(
        ppo.PPOConfig(),
        torso="mlp",
        hidden_sizes=(64, 64),
        trajectory_length=64,
        batch_size=8,
        num_actors=2,
        num_epochs=4,
        num_minibatches=8,
        learning_rate=1e-3,
        learning_rate_decay_updates=400,
        clip_epsilon=0.2,
        value_clip_epsilon=0.0,
        entropy_coef=0.01,
        discount=0.99,
        gae_lambda=0.95,
    )
    settings = {"num_actors": 2, "num_envs_per_actor": 8, "total_env_steps": 200_000}
    return config, settings


def _atari(name: str) -> tuple[ppo.PPOConfig, dict[str, Any]]:
    # CleanRL's Atari PPO (ppo_atari_envpool.py): Nature torso, 128-step
    # rollouts, 4 epochs of 4 minibatches, clip 0.1, entropy 0.01.
    config = dataclasses.replace(
        ppo.PPOConfig(),
        torso="nature",
        hidden_sizes=(512,),
        trajectory_length=128,
        batch_size=8,
        num_epochs=4,
        num_minibatches=4,
        learning_rate=2.5e-4,
        clip_epsilon=0.1,
        value_clip_epsilon=0.1,
        entropy_coef=0.01,
    )
    settings = {
        "param_pull_interval": _ATARI_PULL_INTERVAL[name],
        "total_env_steps": 10_000_000,
        "num_envs_per_actor": 8,
    }
    return config, settings


def _continuous(total_env_steps: int) -> tuple[ppo.PPOConfig, dict[str, Any]]:
    # CleanRL's continuous PPO (ppo_continuous_action.py): 64x64 tanh MLPs, a
    # state-independent log-std, 10 epochs of 32 minibatches... scaled to
    # chunks: 2048 steps per update, observations normalized.
    config = dataclasses.replace(
        ppo.PPOConfig(),
        torso="mlp",
        hidden_sizes=(64, 64),
        trajectory_length=256,
        batch_size=4,
        num_epochs=10,
        num_minibatches=8,
        learning_rate=3e-4,
        clip_epsilon=0.2,
        value_clip_epsilon=0.0,
        entropy_coef=0.0,
        normalize_observations=True,
    )
    return config, {"num_envs_per_actor": 4, "total_env_steps": total_env_steps}


def _mpe() -> tuple[ppo.PPOConfig, dict[str, Any]]:
    # Parameter-shared PPO over every agent's row (independent PPO with one
    # network: de Witt et al. 2020; Yu et al. 2022 on PPO in cooperative tasks).
    # MPE episodes are 25 steps: chunks of two whole episodes. Measured on
    # simple_spread_v3, seed 0, 300k agent steps (final greedy return; a random
    # policy -27.9, the best constant action -24.9): the cartpole preset's
    # values with 16 chunks per actor and 4 epochs ended at -21.9 over 3 seeds
    # (192 updates, entropy still 1.1 of 1.6); 8 chunks and 10 epochs at -19.9,
    # but fell to -42 (greedy -56) at 28-62k before it recovered, and at lr 3e-3
    # ended at -23.1; lr 5e-4 decayed to 0 over the run's ~390 updates did not
    # fall, and evaluated within -19.4 to -20.4 from 117k on.
    # The cartpole preset (the same network, batch, clip, entropy and decay) with
    # chunks of whole episodes, more epochs and a smaller step.
    config = dataclasses.replace(
        _cartpole()[0], trajectory_length=50, num_epochs=10, num_minibatches=4, learning_rate=5e-4
    )
    return config, {"num_envs_per_actor": 8, "total_env_steps": 300_000}


def _minatar() -> tuple[ppo.PPOConfig, dict[str, Any]]:
    # PureJaxRL's PPO values as pgx's MinAtar example runs them (lr 3e-4, 128-step
    # rollouts, clip 0.2, entropy 0.01, GAE 0.95), at a CPU's scale: 8 chunks per batch
    # where it takes 4,096 envs, and 1M env steps where it takes 20M. MinAtar's own torso
    # (Young and Tian, 2019). Not tuned here yet.
    config = dataclasses.replace(
        _cartpole()[0],
        torso="minatar",
        hidden_sizes=(128,),
        trajectory_length=128,
        num_epochs=4,
        num_minibatches=8,
        learning_rate=3e-4,
        learning_rate_decay_updates=0,
    )
    return config, {"num_actors": 2, "num_envs_per_actor": 8, "total_env_steps": 1_000_000}


def _minatar_gymnax() -> tuple[ppo.PPOConfig, dict[str, Any]]:
    # gymnax-blines' agents/<Game>-MinAtar/ppo.yaml (commit 15b76af), the settings its
    # published checkpoints were trained with, so that ours can be set beside them at
    # their budget: separate 256x256 ReLU MLPs on the flattened grid, 64 envs of
    # 128-step rollouts per update, constant lr 5e-4 (its warmup goes from 5e-4 to
    # 5e-4), value clipping at the policy's clip. One actor of 64 envs: its batch is
    # those 64 chunks, as in Anakin's one rollout per update.
    config = dataclasses.replace(
        ppo.PPOConfig(),
        torso="mlp",
        hidden_sizes=(256, 256),
        activation="relu",
        discount=0.999,
        gae_lambda=0.95,
        trajectory_length=128,
        batch_size=64,
        num_actors=1,
        num_epochs=4,
        num_minibatches=8,
        learning_rate=5e-4,
        clip_epsilon=0.2,
        value_clip_epsilon=0.2,
        value_coef=0.5,
        entropy_coef=0.01,
        max_grad_norm=0.5,
    )
    return config, {"num_actors": 1, "num_envs_per_actor": 64, "total_env_steps": 10_000_000}


def ppo_preset(name: str) -> tuple[ppo.PPOConfig, dict[str, Any]]:
    """PPO config and experiment settings of preset `name` (not `auto`)."""
    if name == "default":
        return ppo.PPOConfig(), {}
    if name == "cartpole":
        return _cartpole()
    if name == "mpe":
        return _mpe()
    if name == "minatar":
        return _minatar()
    if name == "minatar_gymnax":
        return _minatar_gymnax()
    if name in _ATARI_PULL_INTERVAL:
        return _atari(name)
    if name == "pendulum":
        return _continuous(500_000)
    if name == "mujoco":
        # 1M env steps: the MuJoCo budget of Schulman et al. (2017, "Proximal
        # Policy Optimization Algorithms", Table 3 has lr 3e-4, 2048 steps per
        # update, 10 epochs, 64x64) and of CleanRL's ppo_continuous_action.py.
        return _continuous(1_000_000)
    raise ValueError(
        f"unknown preset {name!r}; PPO has {PPO_PRESETS} (and auto), or give a .json/.yaml file"
    )
