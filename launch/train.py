"""Trains an agent on the Gorila skeleton.

Examples:
  python -m launch.train                        # DQN on CartPole-v1, ray launcher, this machine
  python -m launch.train --launcher=local --num_actors=1 --logdir=runs/debug
  python -m launch.train --config.batch_size=128 --config.learning_rate=5e-4
  python -m launch.train --ray_address=HEAD_IP:6379  # join an existing Ray cluster
  python -m launch.train --ray_address=HEAD_IP:6379 --num_learner_hosts=2  # 2 learner hosts
  python -m launch.train --learner_mode=gorila --num_learners=2 --num_ps_shards=2

Order of precedence for every setting: explicit flag > preset > default.
"""

import argparse
import dataclasses
import difflib
import sys

from absl import app, flags
from ml_collections import config_flags

from agents import dqn, ppo, sac
from gorila_jax import envs
from gorila_jax.distributed import launchers
from gorila_jax.gorila import compression, mode
from gorila_jax.health import balance
from gorila_jax.learning import checkpoint
from gorila_jax.run import experiment
from launch import presets

AGENTS = {"dqn": dqn.DQNBuilder, "ppo": ppo.PPOBuilder, "sac": sac.SACBuilder}
AGENT_CONFIGS = {"dqn": dqn.DQNConfig, "ppo": ppo.PPOConfig, "sac": sac.SACConfig}

_AGENT = flags.DEFINE_enum("agent", "dqn", list(AGENTS), "Which agent to train.")
_ENV = flags.DEFINE_string("env", "CartPole-v1", "envpool task id.")
_PRESET = flags.DEFINE_string(
    "preset",
    "auto",
    f"Base hyperparameters: one of {', '.join(presets.NAMES)} (auto picks one by --env), "
    "or a .json/.yaml file (see launch/presets.py).",
)
_PRECISION = flags.DEFINE_enum(
    "precision",
    None,
    ["fp32", "bf16", "fp16"],
    "Learner compute precision (parameters stay float32); sets --config.precision.",
)
_LAUNCHER = flags.DEFINE_enum("launcher", "ray", list(launchers.LAUNCHERS), "Where nodes run.")
_RAY_ADDRESS = flags.DEFINE_string(
    "ray_address", None, "Existing Ray cluster (host:port); unset starts a private one."
)
_LOGDIR = flags.DEFINE_string("logdir", "runs/latest", "metrics.csv, TensorBoard, summary.json.")
_SEED = flags.DEFINE_integer("seed", 0, "Root seed; every node's key derives from it.")
_NUM_ACTORS = flags.DEFINE_integer("num_actors", 2, "Actor nodes.", lower_bound=1)
_NUM_ENVS = flags.DEFINE_integer(
    "num_envs_per_actor", 8, "Envs in each actor's envpool.", lower_bound=1
)
_ENV_THREADS = flags.DEFINE_integer(
    "env_threads_per_actor", 1, "envpool worker threads in each actor.", lower_bound=1
)
_PULL = flags.DEFINE_integer(
    "param_pull_interval", 5, "Actor steps between parameter pulls.", lower_bound=1
)
_TOTAL_STEPS = flags.DEFINE_integer(
    "total_env_steps", 100_000, "Stop after this many env steps.", lower_bound=1
)
_LEARNER_DEVICES = flags.DEFINE_integer(
    "num_learner_devices", 0, "Local devices the learner uses; 0 takes all.", lower_bound=0
)
_LEARNER_GPUS = flags.DEFINE_float(
    "learner_gpus", 0.0, "GPUs the learner asks Ray for.", lower_bound=0.0
)
_LEARNER_CPUS = flags.DEFINE_float(
    "learner_cpus", 1.0, "CPUs the learner asks Ray for.", lower_bound=0.0
)
_REPLAY_CPUS = flags.DEFINE_float(
    "replay_cpus", 1.0, "CPUs the replay asks Ray for.", lower_bound=0.0
)
_ACTOR_CPUS = flags.DEFINE_float(
    "cpus_per_actor", 1.0, "CPUs each actor asks Ray for.", lower_bound=0.0
)
_EVAL_EPISODES = flags.DEFINE_integer(
    "eval_episodes", 10, "Greedy episodes per evaluation.", lower_bound=1
)
_EVAL_INTERVAL = flags.DEFINE_float(
    "eval_interval_s", 5.0, "Seconds between evaluations; 0 disables them.", lower_bound=0.0
)
_STOP_AT = flags.DEFINE_float(
    "stop_at_eval_return", None, "End early once an evaluation reaches this mean return."
)
_MAX_WALL = flags.DEFINE_float(
    "max_wall_time_s", 0.0, "End after this many seconds; 0 means no limit.", lower_bound=0.0
)
_CHECKPOINT_INTERVAL = flags.DEFINE_integer(
    "checkpoint_interval_steps",
    5000,
    "Learner steps between checkpoints (and one at the end); 0 disables checkpoints.",
    lower_bound=0,
)
_MAX_CHECKPOINTS = flags.DEFINE_integer(
    "max_checkpoints_to_keep", 2, "Checkpoints kept; older ones are deleted.", lower_bound=1
)
_RESUME = flags.DEFINE_bool(
    "resume", False, "Continue the run in --logdir from its newest usable checkpoint."
)
_TF32 = flags.DEFINE_bool(
    "tf32", False, "TensorFloat-32 matmuls on GPUs (faster, ~3 significant digits)."
)
_LEARNER_MODE = flags.DEFINE_enum(
    "learner_mode",
    "sync",
    list(experiment.LEARNER_MODES),
    "sync: one pmapped learner; gorila: async gradient workers + parameter-server shards.",
)
_NUM_LEARNERS = flags.DEFINE_integer("num_learners", 2, "Gorila gradient workers.", lower_bound=1)
_NUM_PS_SHARDS = flags.DEFINE_integer(
    "num_ps_shards", 2, "Gorila parameter-server shards.", lower_bound=1
)
_MAX_STALENESS = flags.DEFINE_integer(
    "max_staleness", 8, "Gorila: drop gradients more than this many versions old; <0: keep all."
)
_STALENESS_SCALING = flags.DEFINE_bool(
    "staleness_lr_scaling", False, "Gorila: scale each update by 1 / (1 + its staleness)."
)
_ASYNC_UPDATE = flags.DEFINE_integer(
    "async_update", 1, "Gorila: workers pull parameters every this many gradients.", lower_bound=1
)
_COMPRESSION = flags.DEFINE_enum(
    "compression", "none", list(compression.GRADIENT_SCHEMES), "Gorila: gradients on the wire."
)
_OUTLIER_STDS = flags.DEFINE_float(
    "outlier_stds",
    4.0,
    "Gorila: drop gradients with loss > mean + this many stds; 0: off.",
    lower_bound=0.0,
)
_PS_CPUS = flags.DEFINE_float(
    "ps_cpus", 0.5, "CPUs each Gorila parameter-server shard asks Ray for.", lower_bound=0.0
)
_HEARTBEAT_INTERVAL = flags.DEFINE_float(
    "heartbeat_interval", 1.0, "Seconds between node heartbeats to the monitor."
)
_HEARTBEAT_TIMEOUT = flags.DEFINE_float(
    "heartbeat_timeout", 30.0, "A node silent this many seconds is restarted; 0: off."
)
_STALL_TIMEOUT = flags.DEFINE_float(
    "stall_timeout", 300.0, "A node alive but without progress this long is restarted; 0: off."
)
_STARTUP_TIMEOUT = flags.DEFINE_float(
    "startup_timeout", 300.0, "Seconds a (re)started node may take to build and first progress."
)
_MAX_RESTARTS = flags.DEFINE_integer(
    "max_restarts", 3, "Restarts per node (ray launcher); one more fault fails the run."
)
_MAX_NONFINITE = flags.DEFINE_integer(
    "max_nonfinite_steps", 10, "Consecutive non-finite updates before a rollback; 0: never."
)
_ROLLBACK_LR = flags.DEFINE_float(
    "rollback_lr_factor", 0.5, "Each rollback multiplies the learning-rate scale by this."
)
_ROLLBACK_NOISE = flags.DEFINE_float(
    "rollback_param_noise", 0.0, "Std of noise added to parameters after a rollback (0.01)."
)
_REPLAY_PORT = flags.DEFINE_integer(
    "replay_port",
    0,
    "The Reverb server's port (kept across replay restarts); 0: a free one. Reverb "
    "listens on all interfaces: firewall it on hosts reachable from untrusted networks.",
    lower_bound=0,
    upper_bound=65535,
)
_REPLAY_SHARDS = flags.DEFINE_integer(
    "num_replay_shards",
    1,
    "Reverb servers the replay is split over (at most --num_actors); actor i writes to shard "
    "i % K, learners sample across all shards by priority mass. Each holds 1/K of the replay.",
    lower_bound=1,
)
_LEARNER_HOSTS = flags.DEFINE_integer(
    "num_learner_hosts",
    1,
    "Learner processes (one per host, spread over Ray nodes) running each update over all "
    "their devices with jax.distributed; >1 needs --launcher=ray and --learner_mode=sync.",
    lower_bound=1,
)
_PARAM_CACHE = flags.DEFINE_bool(
    "param_cache_per_host",
    False,
    "Actors read parameters from a cache on their host, so the learner (or the shards) "
    "sends each new version once per host instead of once per actor; needs --actors_per_host.",
)
_ACTORS_PER_HOST = flags.DEFINE_integer(
    "actors_per_host",
    0,
    "Actors sharing a host and its parameter cache (actor i on host i // actors_per_host); "
    "only with --param_cache_per_host. Under Ray a host's cache and actors go on one node.",
    lower_bound=0,
)
_PARAM_CACHE_CPUS = flags.DEFINE_float(
    "param_cache_cpus", 0.25, "CPUs each per-host parameter cache asks Ray for (above 0)."
)
_PARAM_CACHE_INTERVAL = flags.DEFINE_float(
    "param_cache_min_fetch_interval_s",
    0.0,
    "Least seconds between two upstream fetches of a parameter cache; 0: on demand.",
    lower_bound=0.0,
)
_MIN_ACTORS = flags.DEFINE_integer(
    "min_actors", 1, "Fewest actors the control file or elastic policy may leave.", lower_bound=1
)
_MAX_ACTORS = flags.DEFINE_integer(
    "max_actors", 64, "Most actors the control file or elastic policy may start.", lower_bound=1
)
_ELASTIC_INTERVAL = flags.DEFINE_float(
    "elastic_interval_s",
    0.0,
    "Seconds between elastic-policy decisions (add an actor when env steps/s are under "
    "--elastic_target_env_steps_per_s and the learner metric's variance is under "
    "--elastic_variance_threshold; remove one above twice it); 0: off.",
    lower_bound=0.0,
)
_ELASTIC_TARGET = flags.DEFINE_float(
    "elastic_target_env_steps_per_s", 0.0, "Elastic policy: the throughput to reach."
)
_ELASTIC_THRESHOLD = flags.DEFINE_float(
    "elastic_variance_threshold", 0.0, "Elastic policy: the 'low variance' bound."
)
_ELASTIC_METRIC = flags.DEFINE_string(
    "elastic_variance_metric",
    "grad_norm",
    "Elastic policy: learner metric whose variance is measured (e.g. grad_norm, loss).",
)
_BALANCE_INTERVAL = flags.DEFINE_float(
    "balance_interval_s",
    30.0,
    "Window over which each actor's share of inserted data is measured; 0: off.",
    lower_bound=0.0,
)
_BALANCE_FACTOR = flags.DEFINE_float(
    "balance_factor",
    1.5,
    "Report an actor whose share of inserted data exceeds this / number of actors (> 1).",
)
_BALANCE_REMEDY = flags.DEFINE_enum(
    "balance_remedy",
    "report",
    list(balance.REMEDIES),
    "What happens to an actor dominant two windows in a row: report only, replace it by a "
    "fresh one with a new seed, or downweight (learners multiply its items' priorities by "
    "--balance_weight; prioritized replay only).",
)
_BALANCE_REPLACE = flags.DEFINE_bool(
    "balance_replace", False, "The same as --balance_remedy=replace."
)
_BALANCE_WEIGHT = flags.DEFINE_float(
    "balance_weight", 0.5, "--balance_remedy=downweight: the factor on priorities, in (0, 1)."
)

# ExperimentConfig field -> the flag that sets it.
_EXPERIMENT_FLAGS = {
    "env_id": _ENV,
    "launcher": _LAUNCHER,
    "ray_address": _RAY_ADDRESS,
    "logdir": _LOGDIR,
    "seed": _SEED,
    "num_actors": _NUM_ACTORS,
    "num_envs_per_actor": _NUM_ENVS,
    "env_threads_per_actor": _ENV_THREADS,
    "param_pull_interval": _PULL,
    "total_env_steps": _TOTAL_STEPS,
    "num_learner_devices": _LEARNER_DEVICES,
    "learner_gpus": _LEARNER_GPUS,
    "learner_cpus": _LEARNER_CPUS,
    "replay_cpus": _REPLAY_CPUS,
    "cpus_per_actor": _ACTOR_CPUS,
    "eval_episodes": _EVAL_EPISODES,
    "eval_interval_s": _EVAL_INTERVAL,
    "stop_at_eval_return": _STOP_AT,
    "max_wall_time_s": _MAX_WALL,
    "checkpoint_interval_steps": _CHECKPOINT_INTERVAL,
    "max_checkpoints_to_keep": _MAX_CHECKPOINTS,
    "resume": _RESUME,
    "tf32": _TF32,
    "learner_mode": _LEARNER_MODE,
    "num_learners": _NUM_LEARNERS,
    "num_ps_shards": _NUM_PS_SHARDS,
    "max_staleness": _MAX_STALENESS,
    "staleness_lr_scaling": _STALENESS_SCALING,
    "async_update": _ASYNC_UPDATE,
    "compression": _COMPRESSION,
    "outlier_stds": _OUTLIER_STDS,
    "ps_cpus": _PS_CPUS,
    "heartbeat_interval_s": _HEARTBEAT_INTERVAL,
    "heartbeat_timeout_s": _HEARTBEAT_TIMEOUT,
    "stall_timeout_s": _STALL_TIMEOUT,
    "startup_timeout_s": _STARTUP_TIMEOUT,
    "max_restarts": _MAX_RESTARTS,
    "max_nonfinite_steps": _MAX_NONFINITE,
    "rollback_lr_factor": _ROLLBACK_LR,
    "rollback_param_noise": _ROLLBACK_NOISE,
    "num_learner_hosts": _LEARNER_HOSTS,
    "replay_port": _REPLAY_PORT,
    "num_replay_shards": _REPLAY_SHARDS,
    "min_actors": _MIN_ACTORS,
    "max_actors": _MAX_ACTORS,
    "elastic_interval_s": _ELASTIC_INTERVAL,
    "elastic_target_env_steps_per_s": _ELASTIC_TARGET,
    "elastic_variance_threshold": _ELASTIC_THRESHOLD,
    "elastic_variance_metric": _ELASTIC_METRIC,
    "balance_interval_s": _BALANCE_INTERVAL,
    "balance_factor": _BALANCE_FACTOR,
    "balance_remedy": _BALANCE_REMEDY,
    "balance_replace": _BALANCE_REPLACE,
    "balance_weight": _BALANCE_WEIGHT,
    "param_cache_per_host": _PARAM_CACHE,
    "actors_per_host": _ACTORS_PER_HOST,
    "param_cache_cpus": _PARAM_CACHE_CPUS,
    "param_cache_min_fetch_interval_s": _PARAM_CACHE_INTERVAL,
}


def _define_config_flag(argv: list[str]) -> None:
    """`--config.<field>` overrides need the agent's config class before parsing.

    ml_collections reads argv while the flag is being defined and raises a
    KeyError for an unknown field, so unknown fields are caught here first.
    """
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--agent", default="dqn")
    agent = parser.parse_known_args(argv[1:])[0].agent
    config_cls = AGENT_CONFIGS.get(agent, dqn.DQNConfig)  # an unknown --agent fails in parsing
    fields = [field.name for field in dataclasses.fields(config_cls)]
    for arg in argv[1:]:
        if arg.startswith("--config."):
            name = arg.removeprefix("--config.").split("=")[0]
            if name not in fields:
                close = difflib.get_close_matches(name, fields, n=3)
                hint = f"; did you mean {', '.join(close)}?" if close else ""
                sys.exit(f"error: {config_cls.__name__} has no field {name!r}{hint}")
    config_flags.DEFINE_config_dataclass("config", config_cls(), "Agent config overrides.")


def _parse_flags(argv: list[str]) -> list[str]:
    """absl parsing, but any bad flag ends the program with one line and exit code 2."""
    try:
        return flags.FLAGS(argv)
    except (flags.Error, KeyError, ValueError, TypeError) as error:
        print(f"error: {error}".replace("\n", " "), file=sys.stderr)
        sys.exit(2)


def make_configs() -> tuple[object, experiment.ExperimentConfig]:
    """Agent config and experiment config from preset and flags, validated."""
    config, preset_settings = presets.load(
        _PRESET.value, _AGENT.value, _ENV.value, set(_EXPERIMENT_FLAGS), _LEARNER_MODE.value
    )
    overrides = config_flags.get_override_values(flags.FLAGS["config"])
    if _PRECISION.value is not None:
        overrides["precision"] = _PRECISION.value
    settings = {
        field: holder.value
        if holder.present or field not in preset_settings
        else preset_settings[field]
        for field, holder in _EXPERIMENT_FLAGS.items()
    }
    # An agent whose config sizes things by the actor count (PPO: per-actor
    # KL, the scaled batch) follows --num_actors unless told otherwise.
    config_fields = {field.name for field in dataclasses.fields(config)}
    if "num_actors" in config_fields and "num_actors" not in overrides:
        overrides["num_actors"] = settings["num_actors"]
    config = dataclasses.replace(config, **overrides)
    return config, experiment.ExperimentConfig(**settings)


def check_configs(builder, exp_config: experiment.ExperimentConfig) -> None:
    """Everything a run checks before it starts a node.

    Raises:
      ValueError: naming the setting at fault.
    """
    exp_config.validate()
    spec = envs.env_spec(exp_config.env_id)
    builder.validate(exp_config.num_learner_devices or 1, spec)
    if exp_config.learner_mode == "gorila":
        mode.check_agent(builder, spec)


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        sys.exit(f"error: unexpected arguments {argv[1:]}")
    try:
        config, exp_config = make_configs()
        builder = AGENTS[_AGENT.value](config)
        check_configs(builder, exp_config)
    except ValueError as error:
        sys.exit(f"error: {error}")
    try:
        summary = experiment.run_experiment(builder, exp_config)
    except KeyboardInterrupt:
        # The run already checkpointed and said how to continue; no traceback.
        sys.exit(130)
    except checkpoint.CheckpointError as error:
        sys.exit(f"error: {error}")
    print(
        f"done: {summary['env_steps']:,} env steps, {summary['learner_steps']:,} updates in "
        f"{summary['wall_time_s']:.1f}s; final greedy return {summary['final_eval_return']:.1f} "
        f"over {summary['final_eval_episodes']} episodes; summary in {exp_config.logdir}",
        flush=True,
    )


if __name__ == "__main__":
    _define_config_flag(sys.argv)
    app.run(main, flags_parser=_parse_flags)
