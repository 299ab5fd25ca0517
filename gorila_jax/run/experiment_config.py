"""`ExperimentConfig`: the settings of a run that are not the agent's hyperparameters."""

import dataclasses

from gorila_jax import envs
from gorila_jax.distributed import launchers
from gorila_jax.gorila import compression
from gorila_jax.health import balance
from gorila_jax.learning import checkpoint
from gorila_jax.run import elastic

LEARNER_MODES = ("sync", "gorila")


@dataclasses.dataclass
class ExperimentConfig:
    """Settings of one run that are not the agent's hyperparameters.

    Attributes:
      env_id: envpool task id.
      num_actors: actor nodes.
      num_envs_per_actor: envs in each actor's envpool.
      env_threads_per_actor: envpool worker threads in each actor.
      param_pull_interval: actor steps between parameter pulls from the learner.
      total_env_steps: the run stops once actors have taken this many env steps.
      seed: root seed; every node's key and env seed derive from it.
      logdir: where metrics.csv, TensorBoard events and summary.json go.
      launcher: "local" (threads in one process) or "ray" (a process per node).
      ray_address: an existing Ray cluster to join; None starts a private one.
      num_learner_devices: local devices the learner pmaps over; 0 takes all.
      learner_gpus: GPUs the learner node asks Ray for.
      learner_cpus, replay_cpus, cpus_per_actor: CPUs each node asks Ray for;
        fractions let more nodes than cores share one machine.
      eval_episodes: greedy episodes per evaluation, and for the final one.
      eval_interval_s: seconds between evaluations during training; 0 disables them.
      stop_at_eval_return: end the run early once an evaluation reaches this mean return.
      max_wall_time_s: end the run after this many seconds; 0 means no limit.
      log_interval_s: seconds between progress lines and metric rows.
      checkpoint_interval_steps: learner steps between checkpoints of learner
        and replay (in `<logdir>/checkpoints`); one more is taken when the run
        stops. 0 disables checkpoints. It bounds what a crash loses: a
        restarted replay node restores the newest replay checkpoint, so the
        items written since it (about this many learner steps' worth) are lost.
      max_checkpoints_to_keep: older checkpoints are deleted. A replay
        checkpoint holds the whole buffer (gigabytes for Atari).
      resume: continue the run in `logdir` from its newest usable checkpoint.
        Without it, a run in a logdir that has checkpoints deletes them.
      tf32: TensorFloat-32 matmuls in the learner (GPUs only; CPUs ignore it).
      learner_mode: "sync" (one pmapped learner) or "gorila" (asynchronous
        gradient workers and parameter-server shards; gorila_jax/gorila/workers.py).
      num_learners: Gorila gradient workers.
      num_ps_shards: Gorila parameter-server shards.
      max_staleness: a shard drops gradients computed on parameters more than
        this many of its versions old; negative accepts any.
      staleness_lr_scaling: shards scale each update by 1 / (1 + its staleness).
      async_update: a gradient worker pulls fresh parameters every this many gradients.
      compression: how gradients travel to the shards (compression.GRADIENT_SCHEMES).
      outlier_stds: a worker drops gradients whose loss is more than this many
        standard deviations above its running mean; 0 disables the rule.
      ps_cpus: CPUs each parameter-server shard asks Ray for.
      heartbeat_interval_s: seconds between the heartbeats (counters) that
        actors and learner send the monitor.
      heartbeat_timeout_s: a node that sent no heartbeat for this long is
        declared dead and restarted; 0 only watches processes.
      stall_timeout_s: a node that heartbeats but whose counters did not move
        for this long (a hung environment) is restarted; 0 disables.
      startup_timeout_s: how long a (re)started node may take to be built and
        to make its first progress.
      max_restarts: restarts allowed per node (the ray launcher replaces a
        faulty node's process); one fault more, or any fault under the local
        launcher, fails the run with the reason. 0 fails at the first fault.
      max_nonfinite_steps: the learner skips updates with a non-finite loss or
        gradient; after this many in a row it rolls back to its newest
        checkpoint (0: skips only, never rolls back).
      rollback_lr_factor: each rollback multiplies the learner's learning-rate
        scale by this (`learner.scale_update`).
      rollback_param_noise: standard deviation of Gaussian noise added to the
        trainable parameters after a rollback (the brief suggests 0.01); 0: none.
      num_learner_hosts: learner processes, one per host, that run every update
        together over all their devices (`jax.distributed`; the learner
        group's nodes learner/0 .. learner/H-1, spread over Ray nodes). Needs
        launcher=ray and learner_mode=sync when above 1. The chief (learner/0)
        alone checkpoints; losing any of the processes restarts all of them
        (a fresh jax.distributed job) from the newest checkpoint.
      param_cache_per_host: actors read parameters from a cache on their host
        (gorila_jax/acting/param_cache.py) instead of from the learner or shards,
        which then send each new version once per host, not once per actor.
      actors_per_host: how many actors share a host (and a cache): actor i is
        on host i // actors_per_host. Only with param_cache_per_host. Under
        Ray each host's cache and actors are packed onto one node where it fits.
      param_cache_cpus: CPUs each cache asks Ray for (above 0, so that it
        gets a bundle next to its actors).
      param_cache_min_fetch_interval_s: least time between two upstream
        fetches of a cache; 0: on demand, one at a time.
      replay_port: the Reverb server's port; 0 picks a free one at launch. The
        port stays the same when the replay node is restarted, so writers and
        samplers find it again. Reverb listens on every interface of its host.
        With K replay shards, shard k listens on replay_port + k.
      num_replay_shards: Reverb servers (K) the replay is split over (the
        replay group's nodes replay/0 .. replay/K-1, gorila_jax/replay/sharded.py).
        Actor i writes to shard i % K; learners sample every batch across all
        shards in proportion to their priority mass, as from one replay, and
        send each new priority to the item's shard. Each shard holds 1/K of
        the agent's replay capacity and minimum size, checkpoints to
        `<logdir>/checkpoints/replay/shard_<k>` (K=1: `replay/` as before) and
        is restarted on its own. At most num_actors (each shard needs a writer).
      min_actors, max_actors: bounds of the actor count while the run goes:
        `<logdir>/control/num_actors` (a count written there is applied by
        the driver; gorila_jax/run/elastic.py) and the elastic policy keep within them.
        The lower bound is raised to num_replay_shards (`actor_count_floor`):
        removing actors never leaves a replay shard without a writer.
      elastic_interval_s: seconds between decisions of the elastic policy
        (add an actor when env steps/s < elastic_target_env_steps_per_s and
        the variance of the learner metric elastic_variance_metric is below
        elastic_variance_threshold; remove one above twice the threshold); 0: off.
      elastic_target_env_steps_per_s, elastic_variance_threshold,
        elastic_variance_metric: see elastic_interval_s and `elastic.ElasticPolicy`.
      balance_interval_s: each actor's share of the data inserted into and
        sampled from replay is measured over windows this long
        (gorila_jax/health/balance.py); 0: off.
      balance_factor: an actor whose inserted share exceeds balance_factor /
        (acting actors) is reported (a warning and the `dominant_actors` metric).
      balance_remedy: what happens to an actor reported in two windows in a
        row: "report" (nothing more), "replace" (a fresh actor with a new
        seed, the next unused actor index, takes its place) or "downweight"
        (the learners multiply the priorities they write for its items by
        balance_weight while it dominates; prioritized tables only).
      balance_replace: the same as balance_remedy="replace" (kept for
        existing command lines; any other remedy beside it is an error).
      balance_weight: the "downweight" factor on a dominant actor's
        priorities, in (0, 1).
    """

    env_id: str = "CartPole-v1"
    num_actors: int = 2
    num_envs_per_actor: int = 8
    env_threads_per_actor: int = 1
    param_pull_interval: int = 5
    total_env_steps: int = 100_000
    seed: int = 0
    logdir: str = "runs/latest"
    launcher: str = "ray"
    ray_address: str | None = None
    num_learner_devices: int = 0
    learner_gpus: float = 0.0
    learner_cpus: float = 1.0
    replay_cpus: float = 1.0
    cpus_per_actor: float = 1.0
    eval_episodes: int = 10
    eval_interval_s: float = 5.0
    stop_at_eval_return: float | None = None
    max_wall_time_s: float = 0.0
    log_interval_s: float = 2.0
    checkpoint_interval_steps: int = 5000
    max_checkpoints_to_keep: int = 2
    resume: bool = False
    tf32: bool = False
    learner_mode: str = "sync"
    num_learners: int = 2
    num_ps_shards: int = 2
    max_staleness: int = 8
    staleness_lr_scaling: bool = False
    async_update: int = 1
    compression: str = "none"
    outlier_stds: float = 4.0
    ps_cpus: float = 0.5
    heartbeat_interval_s: float = 1.0
    heartbeat_timeout_s: float = 30.0
    stall_timeout_s: float = 300.0
    startup_timeout_s: float = 300.0
    max_restarts: int = 3
    max_nonfinite_steps: int = 10
    rollback_lr_factor: float = 0.5
    rollback_param_noise: float = 0.0
    replay_port: int = 0
    num_replay_shards: int = 1
    num_learner_hosts: int = 1
    param_cache_per_host: bool = False
    actors_per_host: int = 0
    param_cache_cpus: float = 0.25
    param_cache_min_fetch_interval_s: float = 0.0
    min_actors: int = 1
    max_actors: int = 64
    elastic_interval_s: float = 0.0
    elastic_target_env_steps_per_s: float = 0.0
    elastic_variance_threshold: float = 0.0
    elastic_variance_metric: str = "grad_norm"
    balance_interval_s: float = 30.0
    balance_factor: float = 1.5
    balance_remedy: str = "report"
    balance_replace: bool = False
    balance_weight: float = 0.5

    @property
    def data_balance_remedy(self) -> str:
        """The remedy in effect: balance_remedy, or "replace" when balance_replace is set."""
        return "replace" if self.balance_replace else self.balance_remedy

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

        Actor i writes to replay shard i % num_replay_shards. A shard nobody
        writes to stops filling, and its rate limiter then holds back every
        learner that samples across the shards. `wiring.remove_actor` also
        refuses to remove a shard's last writer, whatever the count.
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

    def validate(self) -> None:
        """Raises ValueError naming the first setting that cannot work."""
        for name in (
            "num_actors",
            "num_envs_per_actor",
            "env_threads_per_actor",
            "param_pull_interval",
            "total_env_steps",
            "eval_episodes",
            "log_interval_s",
            "max_checkpoints_to_keep",
            "num_learners",
            "num_ps_shards",
            "async_update",
            "heartbeat_interval_s",
            "startup_timeout_s",
            "num_learner_hosts",
            "num_replay_shards",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        for name in (
            "num_learner_devices",
            "learner_gpus",
            "learner_cpus",
            "replay_cpus",
            "cpus_per_actor",
            "eval_interval_s",
            "max_wall_time_s",
            "checkpoint_interval_steps",
            "outlier_stds",
            "ps_cpus",
            "heartbeat_timeout_s",
            "stall_timeout_s",
            "max_restarts",
            "max_nonfinite_steps",
            "rollback_param_noise",
            "actors_per_host",
            "param_cache_min_fetch_interval_s",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative, got {getattr(self, name)}")
        if self.launcher not in launchers.LAUNCHERS:
            raise ValueError(
                f"launcher must be one of {launchers.LAUNCHERS}, got {self.launcher!r}"
            )
        envs.check_env_id(self.env_id)
        if self.learner_mode not in LEARNER_MODES:
            raise ValueError(
                f"learner_mode must be one of {LEARNER_MODES}, got {self.learner_mode!r}"
            )
        if self.compression not in compression.GRADIENT_SCHEMES:
            raise ValueError(
                f"compression must be one of {compression.GRADIENT_SCHEMES}, "
                f"got {self.compression!r}"
            )
        if self.heartbeat_timeout_s and self.heartbeat_timeout_s <= 2 * self.heartbeat_interval_s:
            raise ValueError(
                f"heartbeat_timeout_s ({self.heartbeat_timeout_s}) must exceed twice "
                f"heartbeat_interval_s ({self.heartbeat_interval_s}), or one late beat kills a node"
            )
        if self.num_learner_hosts > 1 and self.launcher != "ray":
            raise ValueError(
                f"num_learner_hosts={self.num_learner_hosts} needs launcher=ray (a process per "
                f"learner host), got launcher={self.launcher!r}"
            )
        if self.num_learner_hosts > 1 and self.learner_mode != "sync":
            raise ValueError(
                f"num_learner_hosts={self.num_learner_hosts} needs learner_mode=sync, "
                f"got learner_mode={self.learner_mode!r}"
            )
        if self.param_cache_per_host and self.actors_per_host <= 0:
            raise ValueError(
                "param_cache_per_host needs actors_per_host (actors on each host, one cache "
                f"each) to be positive, got {self.actors_per_host}"
            )
        if self.actors_per_host and not self.param_cache_per_host:
            raise ValueError(
                f"actors_per_host={self.actors_per_host} only groups actors around per-host "
                "parameter caches: set param_cache_per_host, or leave actors_per_host at 0"
            )
        if self.param_cache_per_host and self.param_cache_cpus <= 0:
            raise ValueError(
                f"param_cache_cpus must be positive with param_cache_per_host, got "
                f"{self.param_cache_cpus}: a cache without resources gets no place by its actors"
            )
        if not 0 <= self.replay_port < 65536:
            raise ValueError(f"replay_port must be in 0..65535, got {self.replay_port}")
        if self.num_replay_shards > self.num_actors:
            raise ValueError(
                f"num_replay_shards={self.num_replay_shards} exceeds num_actors="
                f"{self.num_actors}: actor i writes to shard i % num_replay_shards, so a shard "
                "without an actor would never fill and would hold the learner back"
            )
        if self.replay_port and self.replay_port + self.num_replay_shards > 65536:
            raise ValueError(
                f"replay_port={self.replay_port} with num_replay_shards={self.num_replay_shards}: "
                f"the shards' ports replay_port .. replay_port + {self.num_replay_shards - 1} "
                "must stay below 65536"
            )
        if not 0 < self.rollback_lr_factor <= 1:
            raise ValueError(f"rollback_lr_factor must be in (0, 1], got {self.rollback_lr_factor}")
        elastic.check_bounds(self.min_actors, self.max_actors, self.num_actors)
        if self.elastic_interval_s < 0:
            raise ValueError(
                f"elastic_interval_s must not be negative, got {self.elastic_interval_s}"
            )
        self.elastic_policy  # noqa: B018  raises ValueError for bad elastic_* settings
        balance.validate(
            self.balance_factor, self.balance_interval_s, self.balance_remedy, self.balance_weight
        )
        if self.balance_replace and self.balance_remedy not in ("report", "replace"):
            raise ValueError(
                f"balance_replace=True asks for balance_remedy='replace', but balance_remedy="
                f"{self.balance_remedy!r}: set only one of them"
            )
        if self.resume and not self.checkpoint_interval_steps:
            raise ValueError("resume needs checkpoints, but checkpoint_interval_steps is 0")
        if self.resume and not checkpoint.saved_steps(self.logdir):
            raise ValueError(
                f"resume: no checkpoint in {checkpoint.learner_dir(self.logdir)} "
                "(is --logdir the one of the run to continue?)"
            )
        saved_shards = len(checkpoint.saved_replay_dirs(self.logdir)) if self.resume else 0
        if self.resume and saved_shards != self.num_replay_shards:
            raise ValueError(
                f"resume: the checkpoints in {self.logdir} hold a replay of {saved_shards} "
                f"shard(s), but num_replay_shards={self.num_replay_shards}; resume with "
                f"num_replay_shards={saved_shards}"
            )
