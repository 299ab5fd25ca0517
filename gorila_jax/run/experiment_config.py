"""`ExperimentConfig`: the settings of a run that are not the agent's hyperparameters.

Each setting is one field with its group, help and check (`config_checks.setting`):
launch/train.py makes its flag from it and `validate` runs its check.
"""

import dataclasses

import os
from typing import Any

from gorila_jax import builder as builder_lib
from gorila_jax import config_checks, replay, types
from gorila_jax.acting.settings import DEFAULTS as ACTOR
from gorila_jax.acting.settings import ActorSettings
from gorila_jax.config_checks import NON_NEGATIVE, POSITIVE, setting
from gorila_jax.distributed import launchers
from gorila_jax.federated import privacy
from gorila_jax.gorila import compression
from gorila_jax.gorila.shard_node import DEFAULTS as SHARD
from gorila_jax.gorila.shard_node import ShardSettings
from gorila_jax.gorila.workers import DEFAULTS as WORKER
from gorila_jax.gorila.workers import WorkerSettings
from gorila_jax.learning.settings import DEFAULTS as LEARNER
from gorila_jax.learning.settings import LearnerSettings
from gorila_jax.run import elastic, learning_modes, setting_groups, settings_checks

LEARNER_MODES = tuple(learning_modes.MODES)  # sync, gorila, federated
# The groups of the settings, in the order the docs and --helpfull list them.
SETTING_GROUPS = (
    "run",
    "tracking",
    "actors",
    "learner",
    "replay",
    "checkpoints",
    "gorila",
    "faults",
    "multi-host",
    "elastic",
    "balance",
    "federated",
)


@dataclasses.dataclass
class ExperimentConfig(
    setting_groups.MultiHostSettings,
    setting_groups.FaultSettings,
    setting_groups.TrackingSettings,
    setting_groups.ElasticSettings,
    setting_groups.BalanceSettings,
    setting_groups.FederatedSettings,
):
    """Settings of one run that are not the agent's hyperparameters; see each field's help
    (the groups one subsystem each reads are declared in `setting_groups`)."""

    env_id: str = setting(
        "CartPole-v1",
        "run",
        "envpool task id, mpe/<task>, or any registered Gymnasium env as gym:<id> "
        "(docs/environments.md); --list_envs lists them, and an unknown id fails at once "
        "with its close matches.",
        flag="env",
    )
    total_env_steps: int = setting(
        100_000,
        "run",
        "The run stops once actors have taken this many env steps: near the end each actor "
        "gets a limit of its own, so it ends less than one actor step per actor past it. "
        "The preset's schedules are fitted to it (docs/presets.md).",
        check=POSITIVE,
    )
    seed: int = setting(0, "run", "Root seed; every node's key and env seed derive from it.")
    logdir: str = setting(
        "runs/latest", "run", "Where metrics.csv, TensorBoard events and summary.json go."
    )
    launcher: str = setting(
        "ray",
        "run",
        "Where nodes run: local (threads of one process), ray (a process each), launchpad "
        "(dm-launchpad courier nodes; the DeepMind set only, see BUILD_NOTES.md), or anakin "
        "(a gymnax env: acting, env steps and updates in one compiled loop, docs/anakin.md).",
        choices=launchers.LAUNCHERS,
    )
    launchpad_launch_type: str = setting(
        "local_mp",
        "run",
        "Launchpad's launch type under launcher=launchpad: local_mp (a process per node) or "
        "local_mt (a thread each).",
        choices=launchers.LAUNCHPAD_LAUNCH_TYPES,
    )
    ray_address: str | None = setting(
        None, "run", "Ray cluster (host:port) to join; unset starts a private one."
    )
    max_wall_time_s: float = setting(
        0.0, "run", "End the run after this many seconds; 0 means no limit.", check=NON_NEGATIVE
    )
    log_interval_s: float = setting(
        2.0, "run", "Seconds between progress lines and metric rows.", check=POSITIVE
    )
    eval_episodes: int = setting(
        10, "run", "Greedy episodes per evaluation, and for the final one.", check=POSITIVE
    )
    eval_interval_s: float = setting(
        5.0,
        "run",
        "Seconds between evaluations, and one more of the newest parameters when the run "
        "ends (not on Ctrl-C or SIGTERM); 0 disables them.",
        check=NON_NEGATIVE,
    )
    stop_at_eval_return: float | None = setting(
        None, "run", "End the run early once an evaluation reaches this mean return."
    )
    num_actors: int = setting(2, "actors", "Actor nodes.", check=POSITIVE)
    num_envs_per_actor: int = setting(
        ACTOR.num_envs, "actors", "Envs in each actor's envpool.", check=POSITIVE
    )
    env_threads_per_actor: int = setting(
        ACTOR.env_threads, "actors", "envpool worker threads in each actor.", check=POSITIVE
    )
    param_pull_interval: int = setting(
        ACTOR.param_pull_interval,
        "actors",
        "Actor steps between parameter pulls from the learner.",
        check=POSITIVE,
    )
    cpus_per_actor: float = setting(
        1.0, "actors", "CPUs each actor asks Ray for (fractions share a core).", check=NON_NEGATIVE
    )
    learner_mode: str = setting(
        "sync",
        "learner",
        "sync: one pmapped learner; gorila: async gradient workers + parameter-server shards; "
        "federated: a learner per client, averaged round by round (docs/federated.md).",
        choices=LEARNER_MODES,
    )
    num_learner_devices: int = setting(
        LEARNER.num_devices,
        "learner",
        "Local devices the learner pmaps over; 0 takes all.",
        check=NON_NEGATIVE,
    )
    learner_gpus: float = setting(
        0.0, "learner", "GPUs the learner asks Ray for.", check=NON_NEGATIVE
    )
    learner_cpus: float = setting(
        1.0, "learner", "CPUs the learner asks Ray for.", check=NON_NEGATIVE
    )
    anakin_iterations_per_call: int = setting(
        8,
        "learner",
        "Under launcher=anakin: rollouts (every env's T steps, then one update) per device "
        "call; more calls fewer times, the last call may run fewer.",
        check=POSITIVE,
    )
    xla_cpu_threads: int = setting(
        0,
        "learner",
        "Under launcher=anakin on CPU: XLA:CPU's worker threads in the run's process; 0 "
        "keeps XLA's own count (one per core). 1 keeps a small loop on one thread, faster "
        "there; a large one (big matrix products) is slower (docs/anakin.md).",
        check=NON_NEGATIVE,
    )
    tf32: bool = setting(
        LEARNER.tf32, "learner", "TensorFloat-32 matmuls on GPUs (faster, ~3 significant digits)."
    )
    replay_backend: str = setting(
        replay.DEFAULT_BACKEND,
        "replay",
        "The replay backend: native (numpy tables in the replay node's process, no "
        "TensorFlow; the default set's only one) or reverb (a Reverb server per shard; the "
        "DeepMind set's default). gorila_jax/replay/api.py, docs/replay.md.",
        choices=replay.BACKENDS,
        flag="replay",
    )
    replay_cpus: float = setting(1.0, "replay", "CPUs the replay asks Ray for.", check=NON_NEGATIVE)
    replay_port: int = setting(
        0,
        "replay",
        "The Reverb server's port (shard k: +k), kept across restarts; 0: a free one. Reverb "
        "listens on all interfaces: firewall it on hosts reachable from untrusted networks.",
        check=config_checks.PORT_RANGE,
    )
    demos: str | None = setting(
        None,
        "replay",
        "Directory of demonstration episodes (python -m launch.record, docs/demonstrations.md) "
        "that learners sample at --config.demo_fraction of every batch (off-policy agents).",
    )
    replay_cold_dir: str | None = setting(
        None,
        "replay",
        "Where a tiered replay (--config.hot_replay_size) keeps its cold tier, on each replay "
        "host's local disk (docs/tiered_replay.md); default <logdir>/replay_cold.",
    )
    replay_cold_gb: float = setting(
        0.0,
        "replay",
        "Disk (GiB, all replay shards together) the cold tier's items may take; the oldest "
        "go first. 0: config.cold_replay_size items uncompressed.",
        check=NON_NEGATIVE,
    )
    replay_cold_compression: str = setting(
        "none",
        "replay",
        "How cold items are stored: zlib packs Atari frames about 60x (use it with "
        "--replay_cold_gb); none suits small float rows, which do not compress.",
        choices=replay.COLD_COMPRESSIONS,
    )
    num_replay_shards: int = setting(
        1,
        "replay",
        "Replay nodes (K, at most num_actors) the replay is split over; actor i writes to "
        "shard i % K, learners sample across all by priority mass (gorila_jax/replay/sharded.py).",
        check=POSITIVE,
    )
    checkpoint_interval_steps: int = setting(
        LEARNER.checkpoint_interval_steps,
        "checkpoints",
        "Learner steps between checkpoints of learner and replay, and one at the end; 0: none. "
        "A restarted replay loses the items written since its newest checkpoint.",
        check=NON_NEGATIVE,
    )
    max_checkpoints_to_keep: int = setting(
        LEARNER.max_checkpoints_to_keep,
        "checkpoints",
        "Checkpoints kept; older ones are deleted.",
        check=POSITIVE,
    )
    resume: bool = setting(
        False,
        "checkpoints",
        "Continue the run in logdir from its newest usable checkpoint. Without it, a run in a "
        "logdir that has checkpoints deletes them.",
    )
    num_learners: int = setting(2, "gorila", "Gorila gradient workers.", check=POSITIVE)
    num_ps_shards: int = setting(2, "gorila", "Gorila parameter-server shards.", check=POSITIVE)
    max_staleness: int = setting(
        SHARD.max_staleness,
        "gorila",
        "Shards drop gradients more than this many versions old; <0: keep all.",
    )
    staleness_lr_scaling: bool = setting(
        SHARD.staleness_scaling, "gorila", "Shards scale each update by 1 / (1 + its staleness)."
    )
    async_update: int = setting(
        WORKER.async_update,
        "gorila",
        "Workers pull parameters every this many gradients.",
        check=POSITIVE,
    )
    compression: str = setting(
        WORKER.compression_scheme,
        "gorila",
        "Gradients on the wire to the shards: onebit keeps the error it drops for the next "
        "gradient (error feedback), sparse drops |g| < 1e-4.",
        choices=compression.GRADIENT_SCHEMES,
    )
    outlier_stds: float = setting(
        WORKER.outlier_stds,
        "gorila",
        "Drop gradients with loss > mean + this many stds; 0: off.",
        check=NON_NEGATIVE,
    )
    ps_cpus: float = setting(
        0.5, "gorila", "CPUs each parameter-server shard asks Ray for.", check=NON_NEGATIVE
    )

    @property
    def elastic_policy(self) -> elastic.ElasticPolicy | None:
        """The elastic policy's settings (validated), or None when it is off."""
        if not self.elastic_interval_s:
            return None
        return elastic.ElasticPolicy(
            self.elastic_interval_s,
            self.elastic_target_env_steps_per_s,
            self.elastic_variance_threshold,
            self.elastic_variance_metric,
            self.actor_count_floor,
            self.max_actors,
        )

    @property
    def actor_count_floor(self) -> int:
        """The fewest actors a running program keeps: min_actors, at least num_replay_shards.

        A replay shard nobody writes to stops filling, and its rate limiter then
        holds back every learner that samples across the shards.
        """
        return max(self.min_actors, self.num_replay_shards)

    @property
    def num_actor_hosts(self) -> int:
        """Hosts the actors are grouped on (the last may hold fewer); 0 without caches."""
        if not self.param_cache_per_host:
            return 0
        return -(-self.num_actors // self.actors_per_host)

    @property
    def saves_checkpoints(self) -> bool:
        return self.checkpoint_interval_steps > 0

    def privacy_settings(self) -> privacy.PrivacySettings | None:
        """A federated run's differential-privacy settings; None without DP."""
        if not self.dp_clip_norm:
            return None
        return privacy.PrivacySettings(
            self.dp_clip_norm, self.dp_noise_multiplier, self.dp_delta, self.dp_target_epsilon
        )

    def actor_settings(self) -> ActorSettings:
        """What every actor node of the run takes (`acting/settings.py`)."""
        return ActorSettings(
            num_envs=self.num_envs_per_actor,
            param_pull_interval=self.param_pull_interval,
            heartbeat_interval_s=self.heartbeat_interval_s,
            env_threads=self.env_threads_per_actor,
        )

    def shard_settings(self) -> ShardSettings:
        """What every Gorila parameter-server shard of the run takes (`gorila/shard_node.py`)."""
        return ShardSettings(
            max_staleness=self.max_staleness,
            staleness_scaling=self.staleness_lr_scaling,
            heartbeat_interval_s=self.heartbeat_interval_s,
        )

    def worker_settings(self) -> WorkerSettings:
        """What every Gorila gradient worker of the run takes (`gorila/workers.py`)."""
        return WorkerSettings(
            async_update=self.async_update,
            compression_scheme=self.compression,
            outlier_stds=self.outlier_stds,
        )

    def learner_settings(self) -> LearnerSettings:
        """What every learner node of the run takes (`learning/settings.py`).

        Raises:
          ValueError: a value that cannot work, naming it.
        """
        return LearnerSettings(
            num_devices=self.num_learner_devices,
            heartbeat_interval_s=self.heartbeat_interval_s,
            checkpoint_interval_steps=self.checkpoint_interval_steps,
            max_checkpoints_to_keep=self.max_checkpoints_to_keep,
            tf32=self.tf32,
            max_nonfinite_steps=self.max_nonfinite_steps,
            rollback_lr_factor=self.rollback_lr_factor,
            rollback_param_noise=self.rollback_param_noise,
        )

    def check_budget(self, builder: Any) -> None:
        """Refuses a budget in which the learner cannot make one update.

        Raises:
          ValueError: naming the budget and the setting that needs more.
        """
        needed, why = builder.batch_plan.first_update_after
        # Each replay of its own (a federated client's) fills for its own learner.
        clients = learning_modes.of(self).replay_copies(self)
        if needed * clients > self.total_env_steps:
            each = f", for each of {clients} clients" if clients > 1 else ""
            raise ValueError(
                f"total_env_steps={self.total_env_steps} cannot make one update: the "
                f"learner's first needs {needed * clients:,} env steps ({why}{each}); raise "
                "--total_env_steps or lower that setting"
            )

    def validate(self) -> None:
        """Raises ValueError naming the first setting that cannot work (settings_checks.py)."""
        settings_checks.check(self)

    def replay_tiering(self, builder: Any, spec: types.EnvSpec) -> replay.Tiering | None:
        """The tiers of the agent's replay (`builder_lib.replay_tiers`, in the cold directory);
        None: all in memory.

        Raises:
          ValueError: --replay_cold_dir for a replay that is not tiered.
        """
        sizes = builder_lib.replay_tiers(builder)
        if sizes is None:
            cold_settings = dict(
                replay_cold_dir=self.replay_cold_dir,
                replay_cold_gb=self.replay_cold_gb,
                replay_cold_compression=self.replay_cold_compression != "none",
            )
            for name, given in cold_settings.items():
                if given:
                    raise ValueError(
                        f"--{name}={getattr(self, name)} is for a tiered replay: set "
                        "--config.hot_replay_size (items kept in memory; off-policy agents)"
                    )
            return None
        cold_dir = self.replay_cold_dir or os.path.join(self.logdir, "replay_cold")
        return replay.Tiering(
            builder.replay_layout(spec).sample_table,
            *sizes,
            os.path.abspath(cold_dir),
            int(self.replay_cold_gb * 2**30),
            self.replay_cold_compression,
        )
