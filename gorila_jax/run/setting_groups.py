"""Groups of `ExperimentConfig`'s settings that one subsystem each reads: multi-host
learning and parameter caches, faults (the monitor, supervisor and learner rollbacks),
elastic actors, data balance, federated learning and experiment tracking.
`ExperimentConfig` holds them as its own fields (it derives from these); each is
declared once, here.
"""

import dataclasses

from gorila_jax.config_checks import NON_NEGATIVE, POSITIVE, setting
from gorila_jax.health import balance
from gorila_jax.learning.settings import DEFAULTS as LEARNER


@dataclasses.dataclass
class MultiHostSettings:
    """Learners over several hosts and the actors' parameter caches (docs/multihost.md)."""

    num_learner_hosts: int = setting(
        1,
        "multi-host",
        "Learner processes, one per host, running each update over all their devices with "
        "jax.distributed; >1 needs launcher=ray and learner_mode=sync.",
        check=POSITIVE,
    )
    param_cache_per_host: bool = setting(
        False,
        "multi-host",
        "Actors read parameters from a cache on their host, which gets each new version once "
        "for all of them (gorila_jax/acting/param_cache.py); needs actors_per_host.",
    )
    actors_per_host: int = setting(
        0,
        "multi-host",
        "Actors sharing a host and its parameter cache (actor i on host i // actors_per_host); "
        "only with param_cache_per_host.",
        check=NON_NEGATIVE,
    )
    param_cache_cpus: float = setting(
        0.25,
        "multi-host",
        "CPUs each parameter cache asks Ray for (above 0: a bundle by its actors).",
    )
    param_cache_min_fetch_interval_s: float = setting(
        0.0,
        "multi-host",
        "Least seconds between two upstream fetches of a cache; 0: on demand.",
        check=NON_NEGATIVE,
    )


@dataclasses.dataclass
class FaultSettings:
    """Heartbeats, restarts and rollbacks (docs/fault_tolerance.md)."""

    heartbeat_interval_s: float = setting(
        LEARNER.heartbeat_interval_s,
        "faults",
        "Seconds between the nodes' heartbeats (counters) to the monitor.",
        check=POSITIVE,
        flag="heartbeat_interval",
    )
    heartbeat_timeout_s: float = setting(
        30.0,
        "faults",
        "A node silent this many seconds is restarted; 0: only processes are watched.",
        check=NON_NEGATIVE,
        flag="heartbeat_timeout",
    )
    stall_timeout_s: float = setting(
        300.0,
        "faults",
        "A node alive but without progress (a hung env) this long is restarted; 0: off.",
        check=NON_NEGATIVE,
        flag="stall_timeout",
    )
    startup_timeout_s: float = setting(
        300.0,
        "faults",
        "Seconds a (re)started node may take to build and first progress.",
        check=POSITIVE,
        flag="startup_timeout",
    )
    max_restarts: int = setting(
        3,
        "faults",
        "Restarts per node (ray launcher); one fault more, or any fault under the local "
        "launcher, fails the run with the reason.",
        check=NON_NEGATIVE,
    )
    max_nonfinite_steps: int = setting(
        LEARNER.max_nonfinite_steps,
        "faults",
        "The learner skips non-finite updates; after this many in a row it rolls back to its "
        "newest checkpoint (0: never).",
        check=NON_NEGATIVE,
    )
    rollback_lr_factor: float = setting(
        LEARNER.rollback_lr_factor,
        "faults",
        "Each rollback multiplies the learning-rate scale by this, in (0, 1].",
    )
    rollback_param_noise: float = setting(
        LEARNER.rollback_param_noise,
        "faults",
        "Std of noise added to parameters after a rollback.",
        check=NON_NEGATIVE,
    )


@dataclasses.dataclass
class TrackingSettings:
    """Experiment tracking (gorila_jax/tracking.py)."""

    wandb_project: str = setting(
        "",
        "tracking",
        "Weights & Biases project the run logs to (its metrics rows, config, summary and "
        "curves.png; gorila_jax/tracking.py); empty: off.",
    )
    wandb_entity: str = setting("", "tracking", "W&B entity (user or team); empty: yours.")
    wandb_group: str = setting("", "tracking", "W&B group of the run (a sweep's, say).")
    wandb_tags: str = setting("", "tracking", "W&B tags of the run, comma-separated.")
    wandb_mode: str = setting(
        "online",
        "tracking",
        "online, or offline: W&B keeps the run under <logdir>/wandb for `wandb sync`.",
        choices=("online", "offline"),
    )


@dataclasses.dataclass
class ElasticSettings:
    """Elastic actors (run/elastic.py)."""

    min_actors: int = setting(
        1,
        "elastic",
        "Fewest actors <logdir>/control/num_actors or the elastic policy may leave "
        "(gorila_jax/run/elastic.py); at least num_replay_shards are kept.",
        check=POSITIVE,
    )
    max_actors: int = setting(
        64,
        "elastic",
        "Most actors the control file or the elastic policy may start.",
        check=POSITIVE,
    )
    elastic_interval_s: float = setting(
        0.0,
        "elastic",
        "Seconds between elastic-policy decisions: add an actor below the target throughput "
        "at low variance, remove one above twice the variance threshold; 0: off.",
        check=NON_NEGATIVE,
    )
    elastic_target_env_steps_per_s: float = setting(
        0.0, "elastic", "Elastic policy: the throughput to reach."
    )
    elastic_variance_threshold: float = setting(
        0.0, "elastic", "Elastic policy: the 'low variance' bound."
    )
    elastic_variance_metric: str = setting(
        "grad_norm", "elastic", "Elastic policy: the learner metric whose variance is measured."
    )


@dataclasses.dataclass
class BalanceSettings:
    """Data balance between actors (health/balance.py)."""

    balance_interval_s: float = setting(
        30.0,
        "balance",
        "Window in which each actor's share of replay data is measured; 0: off.",
        check=NON_NEGATIVE,
    )
    balance_factor: float = setting(
        1.5,
        "balance",
        "Report an actor whose share of inserted data exceeds this / actors (above 1).",
    )
    balance_remedy: str = setting(
        "report",
        "balance",
        "What happens to an actor reported two windows in a row: report only, replace it by a "
        "fresh one with a new seed, or downweight its items' priorities by balance_weight "
        "(prioritized replay only).",
        choices=balance.REMEDIES,
    )
    balance_weight: float = setting(
        0.5, "balance", "The downweight factor on a dominant actor's priorities, in (0, 1)."
    )


@dataclasses.dataclass
class FederatedSettings:
    """A federated run and its differential privacy (docs/federated.md)."""

    num_clients: int = setting(
        2,
        "federated",
        "Clients of a federated run, each its own replay, learner and actors (actor i is "
        "client i % num_clients's).",
        check=POSITIVE,
    )
    local_updates_per_round: int = setting(
        100, "federated", "Learner steps each client takes per round.", check=POSITIVE
    )
    federated_rounds: int = setting(
        0, "federated", "Rounds of a federated run; 0: until the run ends.", check=NON_NEGATIVE
    )
    secure_aggregation: bool = setting(
        True, "federated", "Clients mask their updates: the coordinator learns only their sum."
    )
    dp_clip_norm: float = setting(
        0.0,
        "federated",
        "Differential privacy: clip each client's update per round to this L2 norm; 0: no DP.",
        check=NON_NEGATIVE,
    )
    dp_noise_multiplier: float = setting(
        1.0,
        "federated",
        "Differential privacy: the summed update's Gaussian noise over dp_clip_norm.",
        check=POSITIVE,
    )
    dp_delta: float = setting(1e-5, "federated", "The delta of the reported (epsilon, delta).")
    dp_target_epsilon: float | None = setting(
        None,
        "federated",
        "Refuse a federated run whose federated_rounds would spend more epsilon than this.",
    )
