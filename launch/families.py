"""Env families by what an env is: its observations and actions, read from its envpool spec.

`--preset=auto` picks an agent's preset by family (launch/presets.py,
`AUTO_PRESETS`), not by the env's name, so a task nobody tuned for gets the
preset of the envs it is like. A family is one of `FAMILIES`; `family`
raises a ValueError that says why for an env no agent here can take.

A dict of numeric Box observations comes here as the one flat float32 array
`gorila_jax.envs` makes of it (its entries flattened and concatenated in
sorted key order), so it is classified by its total size like any array.

What envpool 1.2.5 ships, family by family (docs/presets.md has the table):
Atari [4, 84, 84] uint8 + Discrete: "image"; classic control, LunarLander,
highway's kinematics, toy_text's Catch and Blackjack, pgx's Backgammon and
Chess: "vector_discrete"; Pendulum, MountainCarContinuous, InvertedPendulum,
dm_control's PointMass (4 numbers flattened): "small_continuous"; MuJoCo,
BipedalWalker, LunarLanderContinuous, MetaWorld, MyoSuite, Adroit,
Playground, the other describable dm_control tasks (CartpoleBalance's 5
numbers, CheetahRun's 17, ...), robotics' goal dicts (Fetch, Hand,
PointMaze), highway's Parking and LaneKeeping: "continuous".
gymnax's MinAtar games ([10, 10, C] float grids of 0/1 channels) + Discrete: "grid";
gymnax's classic control as envpool's. MPE tasks (gorila_jax/multiagent.py) of several
agents: "multiagent"; of
one (mpe/simple_v3): as any other env, "vector_discrete".
Refused with the reason: dicts that do not flatten into numbers (MiniGrid's
image and text, Jumanji's Discrete and MultiBinary entries, FrankaKitchen's
nested dict), tabular state indices (FrozenLake, Taxi), channel-last images
(CarRacing, gfootball), unbounded continuous actions (ViZDoom's buttons,
dm_control's Lqr), and specs envpool cannot load or describe (Procgen
without Qt; 20 dm_control tasks: Finger, Fish, Humanoid, Quadruped, Walker,
PendulumSwingup; Go).
"""

import math

import numpy as np

from gorila_jax import types

# Observations of at most this many numbers with continuous actions get the
# small-network presets: they were measured on Pendulum's 3 (SAC's 64x64
# networks, launch/sac_presets.py); the MuJoCo presets (256x256 for SAC) are
# the published ones for 11 dims (Hopper) and up. 4 takes InvertedPendulum
# along, a cart-pole in MuJoCo.
SMALL_OBSERVATION_SIZE = 4
# Box bounds past this are no bounds: ViZDoom's button actions span
# [DBL_MIN, DBL_MAX]; a tanh-squashed or clipped policy cannot act there.
_BOUND = 1e6
# family -> what its envs are, for `--list_presets` and errors.
FAMILIES = {
    "image": "[C, H, W] uint8 image stacks, discrete actions (Atari)",
    "vector_discrete": "one float or int array (flattened), discrete actions "
    "(CartPole, Acrobot, LunarLander, highway)",
    "small_continuous": f"at most {SMALL_OBSERVATION_SIZE} numbers, continuous actions "
    "(Pendulum, MountainCarContinuous, InvertedPendulum)",
    "continuous": f"more than {SMALL_OBSERVATION_SIZE} numbers, continuous actions "
    "(MuJoCo, dm_control, BipedalWalker, LunarLanderContinuous, MetaWorld, MyoSuite)",
    "grid": "[H, W, C] grids of numbers, channel-last, discrete actions (gymnax's MinAtar)",
    "multiagent": "several agents per env copy, a row each, one shared policy, discrete "
    "actions (MPE's simple_spread)",
}
# family -> the kind of actions its envs have.
ACTIONS = {
    "image": "discrete",
    "vector_discrete": "discrete",
    "small_continuous": "continuous",
    "continuous": "continuous",
    "grid": "discrete",
    "multiagent": "discrete",
}


def describe(spec: types.EnvSpec) -> str:
    """What `spec` observes and how it acts, in words: "shape (4,) float32 observations and
    2 discrete actions"."""
    obs = f"shape {spec.observation_shape} {spec.observation_dtype} observations"
    if spec.discrete:
        described = f"{obs} and {spec.num_actions} discrete actions"
    else:
        described = f"{obs} and continuous actions of shape {spec.action_shape}"
    if spec.agents_per_env > 1:
        described += f", {spec.agents_per_env} agents per copy sharing one policy"
    return described


def family(spec: types.EnvSpec) -> str:
    """The family of `FAMILIES` that `spec` belongs to.

    Raises:
      ValueError: saying why no agent here takes `spec` (channel-last uint8 images,
        images or grids with continuous actions, unbounded continuous actions).
    """
    if not spec.discrete:
        bounds = np.abs(np.array(spec.action_low + spec.action_high, np.float64))
        if not np.all(np.isfinite(bounds)) or np.any(bounds > _BOUND):
            raise ValueError(
                f"{spec.env_id} has continuous actions without finite bounds "
                f"(low {min(spec.action_low):g}, high {max(spec.action_high):g}); agents here "
                "squash or clip actions into bounds"
            )
    if spec.agents_per_env > 1:
        # Rows of several agents that share one policy: short episodes, a reward per
        # agent that moves with what the others do; presets of their own.
        return "multiagent"
    if spec.image_stack:
        channels, height, width = spec.observation_shape
        if channels >= min(height, width):
            raise ValueError(
                f"{spec.env_id} has channel-last images {list(spec.observation_shape)}; "
                "the conv torsos take [C, H, W] stacks (Atari's layout)"
            )
        if not spec.discrete:
            raise ValueError(
                f"{spec.env_id} has image observations with continuous actions; no agent here "
                "has a preset for them (SAC has no conv torso)"
            )
        return "image"
    if spec.grid:
        if not spec.discrete:
            raise ValueError(
                f"{spec.env_id} has grid observations with continuous actions; no agent here "
                "has a preset for them (SAC has no conv torso)"
            )
        return "grid"
    if spec.discrete:
        return "vector_discrete"
    size = math.prod(spec.observation_shape)
    return "small_continuous" if size <= SMALL_OBSERVATION_SIZE else "continuous"
