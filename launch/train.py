"""Trains an agent on the Gorila skeleton.

Examples:
  python -m launch.train                        # DQN on CartPole-v1, ray launcher, this machine
  python -m launch.train --launcher=local --num_actors=1 --logdir=runs/debug
  python -m launch.train --config.batch_size=128 --config.learning_rate=5e-4
  python -m launch.train --ray_address=HEAD_IP:6379  # join an existing Ray cluster
  python -m launch.train --ray_address=HEAD_IP:6379 --num_learner_hosts=2  # 2 learner hosts
  python -m launch.train --learner_mode=gorila --num_learners=2 --num_ps_shards=2
  python -m launch.train --list_presets         # or --list_envs: what --preset and --env take

The console shows the run's progress (a live bar on a terminal) and its own
warnings; other libraries' log lines go to <logdir>/third_party.log unless
--verbose.

Order of precedence for every setting: explicit flag > preset > default.
"""

import argparse
import dataclasses
import difflib
import os
import signal
import sys
import typing
from typing import Any

from absl import app, flags
from ml_collections import config_flags

from agents import registry
from gorila_jax import config_checks, console, multiagent, tracking, xla_cpu
from gorila_jax.learning import checkpoint
from gorila_jax.run import experiment
from gorila_jax.run import logdir as logdir_lib
from launch import listings, presets, schedules

_AGENT = flags.DEFINE_enum(
    "agent", "dqn", list(registry.AGENTS), "Which agent to train (docs/agents.md)."
)
_PRESET = flags.DEFINE_string(
    "preset",
    "auto",
    f"Base hyperparameters: one of {', '.join(presets.NAMES)} (auto picks one by --env), "
    "or a .json/.yaml file (see launch/presets.py).",
)
_ROLE_AGENTS = flags.DEFINE_string(
    "role_agents",
    "",
    "On a multi-agent task with several roles (mpe/simple_tag_v3): the agent of each role, "
    "as role=agent pairs (adversary=ppo,agent=ppo); roles not named take --agent. Each "
    "role gets its agent's --preset; --config.<field> overrides apply to the roles whose "
    "agent is --agent.",
)
_PRECISION = flags.DEFINE_enum(
    "precision",
    None,
    ["fp32", "bf16", "fp16"],
    "Learner compute precision (parameters stay float32); sets --config.precision.",
)
_VERBOSE = flags.DEFINE_bool(
    "verbose",
    False,
    "Show other libraries' log lines (Reverb, XLA, TensorFlow, Ray) on the console instead "
    f"of in <logdir>/{console.THIRD_PARTY_LOG}.",
)
_LIST_PRESETS = flags.DEFINE_bool(
    "list_presets", False, "Print every --preset of every agent, one line each, and exit."
)
_LIST_ENVS = flags.DEFINE_bool(
    "list_envs",
    False,
    "Print envpool's task ids by family with the agents that can act there, and exit.",
)


def _define_setting_flag(field: dataclasses.Field) -> flags.FlagHolder:
    """The flag of an `ExperimentConfig` field, with the help, group, bounds and choices it
    was declared with (`config_checks.setting`).

    Each group is its own section of `--helpfull`; `--help` lists every setting.
    """
    name, help_text = field.metadata["flag"] or field.name, field.metadata["help"]
    # The type a flag parses: float for `float | None`.
    kind = next((t for t in typing.get_args(field.type) if t is not type(None)), field.type)
    group = {"module_name": f"experiment settings: {field.metadata['group']}"}
    if field.metadata["choices"] is not None:
        choices = list(field.metadata["choices"])
        holder = flags.DEFINE_enum(name, field.default, choices, help_text, **group)
    elif kind is bool:
        holder = flags.DEFINE_bool(name, field.default, help_text, **group)
    elif kind is str:
        holder = flags.DEFINE_string(name, field.default, help_text, **group)
    else:
        define = flags.DEFINE_integer if kind is int else flags.DEFINE_float
        low, high = config_checks.flag_bounds(field.metadata["check"], kind)
        holder = define(name, field.default, help_text, lower_bound=low, upper_bound=high, **group)
    flags.declare_key_flag(name)
    return holder


# ExperimentConfig field -> the flag that sets it.
_EXPERIMENT_FLAGS = {
    field.name: _define_setting_flag(field)
    for field in dataclasses.fields(experiment.ExperimentConfig)
}


def _define_config_flag(argv: list[str]) -> None:
    """`--config.<field>` overrides need the agent's config class before parsing.

    ml_collections reads argv while the flag is being defined and raises a
    KeyError for an unknown field, so unknown fields are caught here first.
    """
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--agent", default="dqn")
    agent = parser.parse_known_args(argv[1:])[0].agent
    # An unknown --agent fails in parsing, after this.
    config_cls = registry.AGENTS.get(agent, registry.AGENTS["dqn"]).config
    fields = [field.name for field in dataclasses.fields(config_cls)]
    for arg in argv[1:]:
        if arg.startswith("--config."):
            name = arg.removeprefix("--config.").split("=")[0]
            if name not in fields:
                close = difflib.get_close_matches(name, fields, n=3)
                hint = f"; did you mean {', '.join(close)}?" if close else ""
                _refuse(f"{config_cls.__name__} has no field {name!r}{hint}")
    config_flags.DEFINE_config_dataclass("config", config_cls(), "Agent config overrides.")


def _refuse(message: Any) -> typing.NoReturn:
    """Ends a run refused before any node starts: one `error:` line, exit code 2."""
    print(f"error: {message}".replace("\n", " "), file=sys.stderr, flush=True)
    sys.exit(2)


def _parse_flags(argv: list[str]) -> list[str]:
    """absl parsing, but any bad flag ends the program with one line and exit code 2."""
    try:
        return flags.FLAGS(argv)
    except (flags.Error, KeyError, ValueError, TypeError) as error:
        _refuse(error)


def role_agents(env_id: str, text: str, default_agent: str) -> dict[str, str]:
    """role -> agent of a task of several roles, from `--role_agents` text; {} for any
    other env (where `text` must be empty).

    Raises:
      ValueError: a malformed pair, an unknown role or agent (naming the valid ones).
    """
    roles = multiagent.roles_of(env_id)
    pairs = [pair.strip() for pair in text.split(",") if pair.strip()]
    if not roles:
        if pairs:
            raise ValueError(
                f"--role_agents is for multi-agent tasks with several roles; {env_id} has one"
            )
        return {}
    agents = dict.fromkeys(roles, default_agent)
    for pair in pairs:
        role, sep, agent = pair.partition("=")
        if not sep or role not in roles or agent not in registry.AGENTS:
            raise ValueError(
                f"--role_agents: {pair!r} is not role=agent with a role of {env_id} "
                f"({', '.join(roles)}) and an agent ({', '.join(registry.AGENTS)})"
            )
        agents[role] = agent
    return agents


def make_configs() -> tuple[object, experiment.ExperimentConfig]:
    """Agent config and experiment config from preset and flags, validated.

    On a task of several roles the agent config is a dict role -> config, and the
    experiment settings that presets give come from the first role's preset.
    """
    config, exp_config, _ = _configs_and_schedules()
    return config, exp_config


def _configs_and_schedules() -> tuple[object, experiment.ExperimentConfig, list[str]]:
    """`make_configs`, and a line per agent config of what its schedules run over.

    The named preset's schedules are fitted to the run's own budget
    (launch/schedules.py); what the user set, by flag or in a preset file, is kept.
    """
    env_id = _EXPERIMENT_FLAGS["env_id"].value
    agents = role_agents(env_id, _ROLE_AGENTS.value, _AGENT.value)
    specs = multiagent.role_specs(env_id) if agents else {None: None}
    loaded: dict[str | None, presets.Loaded] = {}
    for role, spec in sorted(specs.items(), key=lambda item: str(item[0])):
        try:
            loaded[role] = presets.load_layers(
                _PRESET.value,
                agents.get(role, _AGENT.value),
                env_id,
                set(_EXPERIMENT_FLAGS),
                _EXPERIMENT_FLAGS["learner_mode"].value,
                spec=spec,
            )
        except ValueError as error:
            raise ValueError(str(error) if role is None else f"role {role}: {error}") from None
    preset_settings = next(iter(loaded.values())).combined()[1]
    overrides = config_flags.get_override_values(flags.FLAGS["config"])
    if _PRECISION.value is not None:
        overrides["precision"] = _PRECISION.value
    settings = {
        field: holder.value
        if holder.present or field not in preset_settings
        else preset_settings[field]
        for field, holder in _EXPERIMENT_FLAGS.items()
    }
    budget = schedules.Budget(settings["total_env_steps"], settings["num_actors"])
    configs, lines = {}, []
    for role, layers in loaded.items():
        config, _ = layers.combined()
        own = dict(overrides) if agents.get(role, _AGENT.value) == _AGENT.value else {}
        kept = set(own) | set(layers.file_agent)
        # An agent whose config sizes things by the actor count (PPO: per-actor
        # KL, the scaled batch) follows --num_actors unless told otherwise.
        config_fields = {field.name for field in dataclasses.fields(config)}
        if "num_actors" in config_fields and "num_actors" not in own:
            own["num_actors"] = settings["num_actors"]
        config = dataclasses.replace(config, **own)
        preset_budget = schedules.preset_budget(layers.settings)
        configs[role] = schedules.fit(config, layers.config, preset_budget, budget, kept)
        line = schedules.describe(configs[role], budget, kept)
        if line is not None:
            lines.append(line if role is None else f"{role}: {line}")
    config = configs if agents else configs[None]
    return config, experiment.ExperimentConfig(**settings), lines


def make_builders(config: Any) -> Any:
    """The builder of `make_configs`'s agent config; a dict role -> builder for a dict."""
    if isinstance(config, dict):
        env_id = _EXPERIMENT_FLAGS["env_id"].value
        agents = role_agents(env_id, _ROLE_AGENTS.value, _AGENT.value)
        return {role: registry.AGENTS[agents[role]].builder(c) for role, c in config.items()}
    return registry.AGENTS[_AGENT.value].builder(config)


def check_configs(builder, exp_config: experiment.ExperimentConfig) -> experiment.CheckedRun:
    """Everything a run checks before it starts a node (`experiment.check_run`).

    Raises:
      ValueError: naming the setting at fault.
    """
    return experiment.check_run(builder, exp_config, registry.agents_taking_demos())


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        _refuse(f"unexpected arguments {argv[1:]}")
    if _LIST_PRESETS.value or _LIST_ENVS.value:
        lines = (listings.preset_lines() if _LIST_PRESETS.value else []) + (
            listings.env_lines() if _LIST_ENVS.value else []
        )
        print("\n".join(lines), flush=True)
        return
    try:
        if flags.FLAGS.xla_cpu_threads:
            # Before the configs are made: importing gymnax already starts JAX's backends.
            xla_cpu.limit_worker_threads(flags.FLAGS.xla_cpu_threads)
        config, exp_config, schedule_lines = _configs_and_schedules()
        checked = check_configs(make_builders(config), exp_config)
    except ValueError as error:
        _refuse(error)
    for line in schedule_lines:  # the run's first lines: what a budget's change changed
        print(line, flush=True)
    try:
        # Held before the log file opens there: a second run writes nothing into it.
        with logdir_lib.hold(exp_config.logdir):
            if not _VERBOSE.value:
                path = console.route_third_party_logs(exp_config.logdir)
                print(
                    f"gorila-jax: third-party logs go to {path} (--verbose shows them)", flush=True
                )
            summary = experiment.run_checked(checked)
    except KeyboardInterrupt as stop:
        # The run already checkpointed and said how to continue; no traceback. The shell's
        # codes: 128 + the signal's number. A second Ctrl-C that comes while the process
        # exits (joining threads at interpreter shutdown) would end it by the signal
        # instead (exit -2, CI 2026-12-06): the stop is done, so it is ignored.
        for number in (signal.SIGINT, signal.SIGTERM):
            signal.signal(number, signal.SIG_IGN)
        by = signal.SIGTERM if isinstance(stop, experiment.Terminated) else signal.SIGINT
        sys.exit(128 + by)
    except (checkpoint.CheckpointError, logdir_lib.LogdirInUse, tracking.TrackingError) as error:
        _refuse(error)
    if "roles" in summary:
        returns = ", ".join(
            f"{role} {figures['final_eval_return']:.1f}"
            for role, figures in summary["roles"].items()
        )
        final = f"final greedy return per agent {returns} over {exp_config.eval_episodes} episodes"
    else:
        final = (
            f"final greedy return {summary['final_eval_return']:.1f} "
            f"over {summary['final_eval_episodes']} episodes"
        )
    # A run that saved nothing put the run before it back: its own files are then in the
    # folder the line above this one named.
    kept = os.path.exists(os.path.join(exp_config.logdir, "summary.json"))
    where = f"summary in {exp_config.logdir}" if kept else "its files in the folder named above"
    print(
        f"done: {summary['env_steps']:,} env steps, {summary['learner_steps']:,} updates in "
        f"{summary['wall_time_s']:.1f}s; {final}; {where}",
        flush=True,
    )
    if summary.get("problem"):
        sys.exit(f"error: {summary['problem']} ({where})")


if __name__ == "__main__":
    _define_config_flag(sys.argv)
    app.run(main, flags_parser=_parse_flags)
