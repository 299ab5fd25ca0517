"""The agents `--agent` names (`AGENTS`) and their named presets.

`AGENTS` is the one registry of agents: the CLI (launch/train.py,
launch/evaluate.py), preset loading and the tests read it. It lives here,
next to the preset functions it holds, because agents/ sits below launch/.

A preset returns the agent config and the experiment fields it changes;
explicit flags (`--num_actors`, `--config.batch_size`, ...) win over it.
`--preset` also takes a JSON or YAML file:

    base: simple              # optional: a named preset to start from
    agent: {batch_size: 128}  # agent config fields
    experiment: {num_actors: 4, param_pull_interval: 10}  # flag-level settings
"""

import dataclasses
import os
from collections.abc import Callable, Mapping
from typing import Any

import yaml

from agents import dqn, ppo, qrdqn, sac
from gorila_jax import envs, types
from gorila_jax.learning import checkpoint
from launch import families, ppo_presets, qrdqn_presets, sac_presets

DQN_PRESETS = ("default", "cartpole", "mpe", "simple", "medium", "hard")
# preset -> (env family, what it changes), for `--list_presets`.
DQN_PRESET_INFO = {
    "default": ("Atari", "DQNConfig() as it is: the brief's Atari values"),
    "cartpole": (
        "CartPole",
        "128x128 MLP with LayerNorm, discount 0.995, lr 1e-3 decayed to 0, batch 64, "
        "replay ratio 8, 8 updates per device call, target copy every 50 updates, "
        "120k env steps (Gorila mode: 256x256, one update per call, Adam b1 0)",
    ),
    "mpe": (
        "MPE (mpe2), several agents",
        "cartpole's, with discount 0.95 and 300k agent steps (schedules over 37.5k updates)",
    ),
    "simple": ("Atari (Pong)", "batch 256, pull every 10 actor steps, 16 envs/actor, 10M steps"),
    "medium": ("Atari (Breakout)", "batch 512, pull every 5 actor steps, 16 envs/actor, 10M steps"),
    "hard": (
        "Atari (Montezuma's Revenge)",
        "batch 1024, pull every actor step, 16 envs/actor, 10M env steps",
    ),
}

# The brief's per-environment table (DESIGN.md section 4): how often actors
# pull parameters and how large a batch the learner takes, by difficulty.
_ATARI_PRESETS = {
    "simple": {"param_pull_interval": 10, "batch_size": 256},  # Pong
    "medium": {"param_pull_interval": 5, "batch_size": 512},  # Breakout
    "hard": {"param_pull_interval": 1, "batch_size": 1024},  # Montezuma's Revenge
}
# The preset `--preset=auto` gives each agent in each env family (what the env
# is, from its spec: launch/families.py). An agent missing from a family
# cannot act there; `load` says so and names the agents that can.
AUTO_PRESETS = {
    "image": {"dqn": "default", "qrdqn": "default", "ppo": "simple"},
    "vector_discrete": {"dqn": "cartpole", "qrdqn": "cartpole", "ppo": "cartpole"},
    "small_continuous": {"ppo": "pendulum", "sac": "pendulum"},
    "continuous": {"ppo": "mujoco", "sac": "mujoco"},
    "multiagent": {"dqn": "mpe", "ppo": "mpe"},
}
# Within the image family, the games of the brief's difficulty table, by the
# env id's name before the version, for the agents that have these presets.
ATARI_DIFFICULTY = {"Pong": "simple", "Breakout": "medium", "MontezumaRevenge": "hard"}


def agents_for(family: str) -> tuple[str, ...]:
    """The agents that can act in `family`'s envs, by name."""
    return tuple(sorted(AUTO_PRESETS[family]))


def check_agent_can_act(agent: str, spec: types.EnvSpec) -> str:
    """`spec`'s family, if `agent` can act there.

    Raises:
      ValueError: the env is of no family (saying why), or `agent` cannot act
        in its family (saying why, and naming the agents that can).
    """
    family = families.family(spec)
    if agent in AUTO_PRESETS[family]:
        return family
    takes = sorted({families.ACTIONS[f] for f, picks in AUTO_PRESETS.items() if agent in picks})
    if families.ACTIONS[family] in takes:  # the actions fit; the family has no preset of its
        why = f"{agent.upper()} has no preset for the {family} family"
    else:
        why = f"{agent.upper()} takes {' or '.join(takes)} actions"
    raise ValueError(
        f"{agent.upper()} cannot act in {spec.env_id}: it has {families.describe(spec)}; "
        f"{why}; agents that can: {', '.join(agents_for(family))}"
    )


def resolve(name: str, env_id: str, agent: str = "dqn") -> str:
    """The preset name `name` stands for: `auto` is `agent`'s preset for the env's family
    (`AUTO_PRESETS`), or the difficulty's for an Atari game the brief names; a named
    preset is taken as given.

    Raises:
      ValueError: for `auto`, as `check_agent_can_act`.
    """
    return name if name != "auto" else auto_preset(agent, envs.env_spec(env_id))


def auto_preset(agent: str, spec: types.EnvSpec) -> str:
    """`agent`'s preset for `spec`'s family, as `resolve` says."""
    family = check_agent_can_act(agent, spec)
    difficulty = ATARI_DIFFICULTY.get(spec.env_id.split("-")[0])
    if family == "image" and difficulty in AGENTS[agent].preset_names:
        return difficulty
    return AUTO_PRESETS[family][agent]


def schedules_over(config: dqn.DQNConfig, env_steps: int) -> dqn.DQNConfig:
    """`config` with its learning-rate cosine and importance-exponent anneal ending after
    `env_steps` env steps: env_steps x samples_per_insert / batch_size updates. A run
    of that budget then ends on small, stable updates."""
    updates = int(env_steps * config.samples_per_insert / config.batch_size)
    return dataclasses.replace(
        config, learning_rate_decay_steps=updates, importance_exponent_anneal_steps=updates
    )


def _cartpole() -> tuple[dqn.DQNConfig, dict[str, Any]]:
    # Solves CartPole-v1 and holds it to the end of the 120k-env-step budget
    # (final greedy return 500 for every seed measured, sync and Gorila:
    # README, "Flags"), about 2 minutes on 2 CPU cores. Why these values
    # differ from the brief's:
    # - LayerNorm before each hidden ReLU: without it Q ran away (mean Q far
    #   above 1 / (1 - gamma) = 200, the most a CartPole return is worth) in
    #   some runs, synchronous ones too, and the greedy return plateaued near
    #   330 or collapsed to 9 by the end; with it every measured run ended at
    #   500 (Gallici et al., 2024, on why normalized features keep TD stable);
    # - gamma 0.995: with 0.99 greedy policies plateau near 300 steps,
    #   drifting off the track, a failure too far ahead for a 100-step
    #   horizon to see;
    # - epsilon ends at 0.01: with 0.05 the final greedy return varied
    #   between 450 and 500 from run to run; near-greedy training episodes
    #   show the learner the slow drift that the greedy policy must fix;
    # - the cosine schedule reaches 0 at the end of the budget (120k env
    #   steps x 8 samples per insert / 64 per batch = 15k updates), so the
    #   run ends on small, stable updates;
    # - a replay ratio of 8 and target copies every 50 updates: ratios of
    #   16 and more, or copies every 10-25 updates, diverged in some runs
    #   (measured before LayerNorm);
    # - 128x128 and 8 updates per device call (issue 17): an update of 256x256 took
    #   about 2 ms of CPU, 128x128 about 1 ms (bench/dqn_profile.py has where the rest of a
    #   run's time goes); over seeds 1-3 the greedy return first reached 475 at 20k, 57k
    #   and 43k env steps, the 100-episode training mean at 64k, 80k and 89k (256x256, one
    #   update per call: 66-77k and 93-116k), and every run ended at 500.
    config = dataclasses.replace(
        dqn.DQNConfig(),
        hidden_sizes=(128, 128),
        updates_per_dispatch=8,
        layer_norm=True,
        discount=0.995,
        learning_rate=1e-3,
        learning_rate_final_fraction=0.0,
        adam_eps=1e-8,
        batch_size=64,
        target_update_period=50,
        samples_per_insert=8.0,
        min_replay_size=1_000,
        max_replay_size=120_000,
        epsilon_end=0.01,
        epsilon_decay_steps=8_000,
    )
    return schedules_over(config, 120_000), {"total_env_steps": 120_000, "num_envs_per_actor": 8}


def _mpe() -> tuple[dqn.DQNConfig, dict[str, Any]]:
    # MPE tasks of several agents (docs/multiagent.md), measured on simple_spread_v3
    # over seeds 0-2, the final greedy return per agent (random -27.9, best constant
    # action -24.9, PPO's mpe preset -21.3):
    # - the cartpole preset as it is (120k agent steps): -25.7, -22.9, -24.8;
    # - 300k agent steps (PPO's mpe budget), the learning-rate and importance
    #   schedules stretched over its 37.5k updates: with discount 0.995 -22.4, -20.6,
    #   -24.8 (IQM -22.6), with 0.95 -17.7, -20.6, -20.5 (IQM -19.6 [-20.6, -17.7]).
    #   An MPE episode is 25 steps and its rewards are distances now: a long horizon
    #   only adds noise to the targets.
    config, settings = _cartpole()
    config = schedules_over(dataclasses.replace(config, discount=0.95), 300_000)
    return config, {**settings, "total_env_steps": 300_000}


def _atari(name: str) -> tuple[dqn.DQNConfig, dict[str, Any]]:
    # The brief's Atari defaults (DQNConfig()) with the difficulty's pull
    # interval and batch. 10M env steps = 40M frames, the usual DQN budget
    # order; a 1M-item replay of 84x84x4 uint8 transitions needs tens of GiB
    # on a real host (README, "Atari").
    values = _ATARI_PRESETS[name]
    config = dataclasses.replace(dqn.DQNConfig(), batch_size=values["batch_size"])
    settings = {
        "param_pull_interval": values["param_pull_interval"],
        "total_env_steps": 10_000_000,
        "num_envs_per_actor": 16,
    }
    return config, settings


def dqn_preset(name: str) -> tuple[dqn.DQNConfig, dict[str, Any]]:
    """DQN config and experiment settings of preset `name` (not `auto`)."""
    if name == "default":
        return dqn.DQNConfig(), {}
    if name == "cartpole":
        return _cartpole()
    if name == "mpe":
        return _mpe()
    if name in _ATARI_PRESETS:
        return _atari(name)
    raise ValueError(
        f"unknown preset {name!r}; DQN has {DQN_PRESETS} (and auto), or give a .json/.yaml file"
    )


# What Gorila mode changes in the cartpole presets of DQN and QR-DQN (see
# `dqn_gorila_preset`): Adam's b1, and the network and one update per call its
# measured runs had (a worker pushes one gradient per call).
GORILA_CARTPOLE = {"adam_b1": 0.0, "hidden_sizes": (256, 256), "updates_per_dispatch": 1}


def dqn_gorila_preset(name: str) -> tuple[dqn.DQNConfig, dict[str, Any]]:
    """`dqn_preset(name)` as Gorila mode (`--learner_mode=gorila`) needs it.

    Asynchronous workers add momentum of their own: a gradient applied one
    update late acts like momentum 1 - 1/N for N workers (Mitliagkas et
    al., 2016, "Asynchrony begets momentum"), on top of Adam's. With the
    cartpole preset's b1 = 0.9, 2 workers and 2 shards plateaued at 300-440
    (README, "Gorila mode"); with b1 = 0.5 they reached 500 but swung
    between 240 and 500 after; with b1 = 0 (RMSProp with Adam's bias
    correction, the Gorila paper's optimizer family) they reached 475 at
    46k env steps and stayed at 490-500.

    Issue 17 reported the default command (`ray`, outlier filter on) at
    485.7 after 82k env steps and ending at 153.5; with this preset
    (LayerNorm, b1 = 0) it was measured again (2026-12-01, the loaded
    2-core machine): seeds 0, 1 and 3 ended at 500.0 (500 at every
    evaluation after 60k env steps but one), with mean Q below 175 and 8-17
    loss-outlier drops of about 14.9k gradients (docs/gorila.md, "Issue 17").
    No collapse, so nothing changed here.
    """
    config, settings = dqn_preset(name)
    if name in ("cartpole", "mpe"):
        # mpe: not measured in Gorila mode; it takes cartpole's changes, one gradient per
        # call (which Gorila mode needs) among them.
        config = dataclasses.replace(config, **GORILA_CARTPOLE)
    return config, settings


Preset = Callable[[str], tuple[Any, dict[str, Any]]]


@dataclasses.dataclass(frozen=True)
class Agent:
    """One agent `--agent` can name.

    Attributes:
      builder: its `AgentBuilder` class, made from a config.
      config: its config dataclass; `config()` is its default.
      preset: preset name (not auto) -> (config, experiment settings).
      preset_names: the names `preset` takes.
      gorila_preset: `preset` as Gorila mode needs it; None: `preset` there too.
      preset_info: preset name -> (env family, what it changes), for `--list_presets`.
    """

    builder: type
    config: type
    preset: Preset
    preset_names: tuple[str, ...]
    gorila_preset: Preset | None = None
    preset_info: Mapping[str, tuple[str, str]] = dataclasses.field(default_factory=dict)


AGENTS = {
    "dqn": Agent(
        dqn.DQNBuilder, dqn.DQNConfig, dqn_preset, DQN_PRESETS, dqn_gorila_preset, DQN_PRESET_INFO
    ),
    "ppo": Agent(
        ppo.PPOBuilder,
        ppo.PPOConfig,
        ppo_presets.ppo_preset,
        ppo_presets.PPO_PRESETS,
        preset_info=ppo_presets.PPO_PRESET_INFO,
    ),
    "sac": Agent(
        sac.SACBuilder,
        sac.SACConfig,
        sac_presets.sac_preset,
        sac_presets.SAC_PRESETS,
        preset_info=sac_presets.SAC_PRESET_INFO,
    ),
    "qrdqn": Agent(
        qrdqn.QRDQNBuilder,
        qrdqn.QRDQNConfig,
        qrdqn_presets.qrdqn_preset,
        qrdqn_presets.QRDQN_PRESETS,
        qrdqn_presets.qrdqn_gorila_preset,
        qrdqn_presets.QRDQN_PRESET_INFO,
    ),
}
# Every name --preset takes, for some agent.
NAMES = ("auto", *dict.fromkeys(name for agent in AGENTS.values() for name in agent.preset_names))


def agents_taking_demos() -> tuple[str, ...]:
    """The agents that can learn from demonstrations (`--demos`): their builder's
    `demo_fraction` is a number, not None."""
    return tuple(
        name
        for name, agent in AGENTS.items()
        if agent.builder(agent.config()).demo_fraction is not None
    )


def is_file(name: str) -> bool:
    return name.endswith((".json", ".yaml", ".yml"))


@dataclasses.dataclass(frozen=True)
class Loaded:
    """A preset as its layers: the named preset's config and settings, and what a preset
    file sets on top of them (empty for a named preset)."""

    config: Any
    settings: dict[str, Any]
    file_agent: dict[str, Any] = dataclasses.field(default_factory=dict)
    file_experiment: dict[str, Any] = dataclasses.field(default_factory=dict)

    def combined(self) -> tuple[Any, dict[str, Any]]:
        """The agent config and experiment settings, the file's values over the preset's."""
        config = dataclasses.replace(self.config, **self.file_agent)
        return config, {**self.settings, **self.file_experiment}


def load(
    name: str,
    agent: str,
    env_id: str,
    experiment_fields: set[str],
    learner_mode: str = "sync",
    spec: types.EnvSpec | None = None,
) -> tuple[Any, dict[str, Any]]:
    """The agent config and experiment settings of a preset name or a preset file.

    In `learner_mode` "gorila", named presets (and a file's base) come from
    the agent's `gorila_preset` where it has one. `spec`: the spec the agent
    acts on, where it is not `env_id`'s (one role of a task of several roles).

    Raises:
      ValueError: an env `agent` cannot act in (`check_agent_can_act`), unknown
        preset, unreadable file, or a field the agent config or the experiment
        does not have (named, so a typo is not silently ignored).
    """
    return load_layers(name, agent, env_id, experiment_fields, learner_mode, spec).combined()


def load_layers(
    name: str,
    agent: str,
    env_id: str,
    experiment_fields: set[str],
    learner_mode: str = "sync",
    spec: types.EnvSpec | None = None,
) -> Loaded:
    """`load`, its layers apart: a run fits the named preset's schedules to its own budget
    and keeps what the file sets (launch/schedules.py)."""
    entry = AGENTS[agent]
    spec = spec or envs.env_spec(env_id)
    check_agent_can_act(agent, spec)  # for named presets and files too
    preset = entry.preset
    if learner_mode == "gorila" and entry.gorila_preset is not None:
        preset = entry.gorila_preset
    if not is_file(name):
        return Loaded(*preset(auto_preset(agent, spec) if name == "auto" else name))
    if not os.path.exists(name):
        raise ValueError(f"preset file {name!r} does not exist")
    with open(name) as f:
        try:
            content = yaml.safe_load(f) or {}  # YAML is a superset of JSON
        except yaml.YAMLError as error:
            raise ValueError(f"preset file {name!r} is not valid JSON/YAML: {error}") from None
    if not isinstance(content, dict) or set(content) - {"base", "agent", "experiment"}:
        raise ValueError(
            f"preset file {name!r} must be a mapping with keys base, agent, experiment; "
            f"got {sorted(content) if isinstance(content, dict) else type(content).__name__}"
        )
    base = content.get("base", "auto")
    if is_file(base):
        raise ValueError(f"preset file {name!r}: base must be a preset name, got {base!r}")
    config, settings = preset(auto_preset(agent, spec) if base == "auto" else base)
    agent_values = content.get("agent") or {}
    known = {field.name: field for field in dataclasses.fields(config)}
    for field, value in agent_values.items():
        if field not in known:
            raise ValueError(
                f"preset file {name!r}: {type(config).__name__} has no field {field!r}"
            )
        if isinstance(value, list):
            agent_values[field] = tuple(value)
    experiment_values = content.get("experiment") or {}
    unknown = set(experiment_values) - experiment_fields
    if unknown:
        raise ValueError(f"preset file {name!r}: unknown experiment settings {sorted(unknown)}")
    return Loaded(config, settings, agent_values, experiment_values)


def _registered(path: str, role: str) -> type:
    """The class config.json names by import path: the `role` ("builder" or "config") of an
    agent in `AGENTS`, so a record cannot make this import anything else."""
    for agent in AGENTS.values():
        cls = getattr(agent, role)
        if f"{cls.__module__}.{cls.__qualname__}" == path:
            return cls
    raise ValueError(f"config.json names {path!r}, which is not an agent in agents/")


def builder_from_record(record: dict, epsilon: float | None = None):
    """The agent's builder from a config.json record, with the evaluation epsilon set."""
    config_cls = _registered(record["agent_config_class"], "config")
    config = checkpoint.config_from_dict(config_cls, record["agent_config"])
    if epsilon is not None:
        if not hasattr(config, "eval_epsilon"):
            raise ValueError(f"{config_cls.__name__} has no eval_epsilon for --epsilon to set")
        config = dataclasses.replace(config, eval_epsilon=epsilon)
    return _registered(record["builder"], "builder")(config)
