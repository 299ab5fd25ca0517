"""The checks of a run's settings (`ExperimentConfig.validate`): each refuses what cannot
work with one line naming the setting, before anything starts."""

import dataclasses
from typing import Any

from gorila_jax import config_checks, envs, replay
from gorila_jax.federated import privacy
from gorila_jax.health import balance
from gorila_jax.run import combinations, elastic
from gorila_jax.run import logdir as logdir_lib


def check(cfg: Any) -> None:
    """Raises ValueError naming the first setting that cannot work."""
    config_checks.check_settings(cfg)
    logdir_lib.check_writable(cfg.logdir)
    envs.check_env_id(cfg.env_id)
    _check_hosts(cfg)
    combinations.check_settings(cfg)
    for name in ("anakin_iterations_per_call", "xla_cpu_threads"):
        if cfg.launcher != "anakin" and getattr(cfg, name) != _default(cfg, name):
            raise ValueError(
                f"{name}={getattr(cfg, name)} is for launcher=anakin, not {cfg.launcher}"
            )
    _check_replay(cfg)
    cfg.learner_settings()  # raises for learner settings that cannot work
    if cfg.heartbeat_timeout_s and cfg.heartbeat_timeout_s <= 2 * cfg.heartbeat_interval_s:
        raise ValueError(
            f"heartbeat_timeout_s ({cfg.heartbeat_timeout_s}) must exceed twice "
            f"heartbeat_interval_s ({cfg.heartbeat_interval_s}), or one late beat kills a node"
        )
    elastic.check_bounds(cfg.min_actors, cfg.max_actors, cfg.num_actors)
    cfg.elastic_policy  # noqa: B018  raises ValueError for bad elastic_* settings
    balance.validate(
        cfg.balance_factor, cfg.balance_interval_s, cfg.balance_remedy, cfg.balance_weight
    )
    _check_resume(cfg)
    _check_federated(cfg)
    _check_tracking(cfg)


def _default(cfg: Any, name: str) -> Any:
    """The declared default of setting `name`."""
    return next(f.default for f in dataclasses.fields(cfg) if f.name == name)


def _check_tracking(cfg: Any) -> None:
    """W&B settings without a project would be ignored: refused instead."""
    if cfg.wandb_project:
        return
    asked = [name for name in ("wandb_entity", "wandb_group", "wandb_tags") if getattr(cfg, name)]
    if cfg.wandb_mode != "online":
        asked.append("wandb_mode")
    if asked:
        raise ValueError(f"{', '.join(asked)} need wandb_project (W&B logging is off)")


def _check_hosts(cfg: Any) -> None:
    """Per-host parameter caches: the settings they need together (what learner hosts
    combine with is in run/combinations.py)."""
    if cfg.param_cache_per_host and cfg.actors_per_host <= 0:
        raise ValueError(
            "param_cache_per_host needs actors_per_host (actors on each host, one cache "
            f"each) to be positive, got {cfg.actors_per_host}"
        )
    if cfg.actors_per_host and not cfg.param_cache_per_host:
        raise ValueError(
            f"actors_per_host={cfg.actors_per_host} only groups actors around per-host "
            "parameter caches: set param_cache_per_host, or leave actors_per_host at 0"
        )
    if cfg.param_cache_per_host and cfg.param_cache_cpus <= 0:
        raise ValueError(
            f"param_cache_cpus must be positive with param_cache_per_host, got "
            f"{cfg.param_cache_cpus}: a cache without resources gets no place by its actors"
        )


def _check_replay(cfg: Any) -> None:
    """Replay shards need a writer each and ports below 65536; what the native backend
    does not do, or a backend this set does not install, is refused."""
    try:
        replay.require(cfg.replay_backend)
    except replay.BackendMissing as error:
        raise ValueError(str(error)) from None
    if cfg.num_replay_shards > cfg.num_actors:
        raise ValueError(
            f"num_replay_shards={cfg.num_replay_shards} exceeds num_actors="
            f"{cfg.num_actors}: actor i writes to shard i % num_replay_shards, so a shard "
            "without an actor would never fill and would hold the learner back"
        )
    if cfg.replay_port and cfg.replay_port + cfg.num_replay_shards > 65536:
        raise ValueError(
            f"replay_port={cfg.replay_port} with num_replay_shards={cfg.num_replay_shards}: "
            f"the shards' ports replay_port .. replay_port + {cfg.num_replay_shards - 1} "
            "must stay below 65536"
        )
    if cfg.replay_backend == replay.NATIVE and cfg.replay_port:
        raise ValueError(
            f"replay_port={cfg.replay_port} is the Reverb server's port; the native replay "
            "serves through its node's client and has none (leave it at 0, or "
            "--replay=reverb)"
        )


def _check_resume(cfg: Any) -> None:
    """What `resume` needs of the settings; what it needs of the logdir is checked as the
    run readies it (run/resume.py)."""
    if cfg.resume and not cfg.checkpoint_interval_steps:
        raise ValueError("resume needs checkpoints, but checkpoint_interval_steps is 0")


def _check_federated(cfg: Any) -> None:
    """What a federated run cannot do yet, refused at once; its privacy budget."""
    if cfg.learner_mode != "federated":
        if cfg.dp_clip_norm or cfg.dp_target_epsilon is not None:
            raise ValueError("dp_clip_norm and dp_target_epsilon need learner_mode=federated")
        return
    if cfg.num_clients < 2:
        raise ValueError(f"a federated run needs num_clients >= 2, got {cfg.num_clients}")
    if cfg.num_actors < cfg.num_clients:
        raise ValueError(
            f"num_actors ({cfg.num_actors}) must be at least num_clients "
            f"({cfg.num_clients}): every client acts in its own envs"
        )
    settings = cfg.privacy_settings()
    if settings is None:
        if cfg.dp_target_epsilon is not None:
            raise ValueError("dp_target_epsilon needs differential privacy: set dp_clip_norm")
        return
    if settings.target_epsilon is not None:
        if not cfg.federated_rounds:
            raise ValueError(
                f"dp_target_epsilon={settings.target_epsilon:g} needs federated_rounds: at "
                f"dp_noise_multiplier={settings.noise_multiplier:g} the target allows "
                f"{privacy.max_rounds(settings)} rounds"
            )
        try:
            privacy.check_budget(settings, cfg.federated_rounds)
        except privacy.PrivacyBudgetExceeded as error:
            raise ValueError(f"federated_rounds={cfg.federated_rounds}: {error}") from None
