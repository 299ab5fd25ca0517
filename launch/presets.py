"""Named presets and preset files for the agents of `agents.registry.AGENTS`, and the
preset `--preset=auto` picks by what the env is.

A preset returns the agent config and the experiment fields it changes;
explicit flags (`--num_actors`, `--config.batch_size`, ...) win over it.
`--preset` also takes a JSON or YAML file:

    base: simple              # optional: a named preset to start from
    agent: {batch_size: 128}  # agent config fields
    experiment: {num_actors: 4, param_pull_interval: 10}  # flag-level settings
"""

import dataclasses
import os
from typing import Any

import yaml

from agents.registry import AGENTS
from gorila_jax import envs, types
from gorila_jax.learning import config_record
from launch import families

# The preset `--preset=auto` gives each agent in each env family (what the env
# is, from its spec: launch/families.py). An agent missing from a family
# cannot act there; `load` says so and names the agents that can.
AUTO_PRESETS = {
    "image": {"dqn": "default", "qrdqn": "default", "ppo": "simple"},
    "vector_discrete": {"dqn": "cartpole", "qrdqn": "cartpole", "ppo": "cartpole"},
    "small_continuous": {"ppo": "pendulum", "sac": "pendulum"},
    "continuous": {"ppo": "mujoco", "sac": "mujoco"},
    "grid": {"dqn": "minatar", "qrdqn": "minatar", "ppo": "minatar"},
    "multiagent": {"dqn": "mpe", "ppo": "mpe"},
}
# Within a family, the preset an env's name (before the version) picks, for the
# agents that have it: the Atari games of the brief's difficulty table, and the
# vector tasks RL Zoo tuned DQN's values for.
BY_ENV_NAME = {
    "image": {"Pong": "simple", "Breakout": "medium", "MontezumaRevenge": "hard"},
    "vector_discrete": {"LunarLander": "lunarlander", "Acrobot": "lunarlander"},
}


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
    (`AUTO_PRESETS`), or the one its name picks within the family (`BY_ENV_NAME`) where
    the agent has that preset; a named preset is taken as given.

    Raises:
      ValueError: for `auto`, as `check_agent_can_act`.
    """
    return name if name != "auto" else auto_preset(agent, envs.env_spec(env_id))


def auto_preset(agent: str, spec: types.EnvSpec) -> str:
    """`agent`'s preset for `spec`'s family, as `resolve` says."""
    family = check_agent_can_act(agent, spec)
    by_name = BY_ENV_NAME.get(family, {}).get(spec.env_id.split("-")[0])
    if by_name in AGENTS[agent].preset_names:
        return by_name
    return AUTO_PRESETS[family][agent]


# Every name --preset takes, for some agent.
NAMES = ("auto", *dict.fromkeys(name for agent in AGENTS.values() for name in agent.preset_names))


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
    config = config_record.config_from_dict(config_cls, record["agent_config"])
    if epsilon is not None:
        if not hasattr(config, "eval_epsilon"):
            raise ValueError(f"{config_cls.__name__} has no eval_epsilon for --epsilon to set")
        config = dataclasses.replace(config, eval_epsilon=epsilon)
    return _registered(record["builder"], "builder")(config)
