"""Which settings a kind of run cannot combine with yet: one table, from which the checks,
their messages and docs/flags.md's table ("Settings that do not combine") are made.

A kind of run (a launcher, a learning mode, a multi-agent env of several roles) refuses
some features by name. `check_settings` refuses them from the settings alone, as the
config is validated; `check_agents` refuses those that depend on the agent (a tiered
replay), as the run is checked with its builders. Each feature is checked in one of the
two, never both.
"""

import dataclasses
from typing import Any, Callable, Sequence

from gorila_jax import builder as builder_lib
from gorila_jax import envs, multiagent
from gorila_jax.learning import settings as learner_settings

_ROLLBACK = ("max_nonfinite_steps", "rollback_lr_factor", "rollback_param_noise")

# Feature name (as refusals and the docs name it) -> whether the settings ask for it.
SETTING_FEATURES: dict[str, Callable[[Any], bool]] = {
    "resume": lambda cfg: bool(cfg.resume),
    "ray_address": lambda cfg: bool(cfg.ray_address),
    "num_replay_shards > 1": lambda cfg: cfg.num_replay_shards > 1,
    "num_learner_hosts > 1": lambda cfg: cfg.num_learner_hosts > 1,
    "param_cache_per_host": lambda cfg: bool(cfg.param_cache_per_host),
    "elastic_interval_s": lambda cfg: bool(cfg.elastic_interval_s),
    "balance_remedy=replace": lambda cfg: bool(
        cfg.balance_interval_s and cfg.balance_remedy == "replace"
    ),
    "demos": lambda cfg: bool(cfg.demos),
    "stop_at_eval_return": lambda cfg: cfg.stop_at_eval_return is not None,
    "learner_mode=federated": lambda cfg: cfg.learner_mode == "federated",
    "learner_mode=gorila": lambda cfg: cfg.learner_mode == "gorila",
    "replay_backend=reverb, replay_port or a replay_cold setting": lambda cfg: (
        cfg.replay_backend == "reverb"
        or bool(cfg.replay_port or cfg.replay_cold_dir or cfg.replay_cold_gb)
        or cfg.replay_cold_compression != "none"
    ),
    "launcher=launchpad": lambda cfg: cfg.launcher == "launchpad",
    "launcher=local": lambda cfg: cfg.launcher == "local",
    "num_learner_devices above 1 with launcher=local": lambda cfg: (
        cfg.launcher == "local" and cfg.num_learner_devices > 1
    ),
    "env_threads_per_actor above 1": lambda cfg: cfg.env_threads_per_actor > 1,
    "max_nonfinite_steps, rollback_lr_factor or rollback_param_noise off its default": (
        lambda cfg: any(
            getattr(cfg, name) != getattr(learner_settings.DEFAULTS, name) for name in _ROLLBACK
        )
    ),
}
# Feature name -> whether one of the run's agents asks for it.
AGENT_FEATURES: dict[str, Callable[[builder_lib.AgentBuilder], bool]] = {
    "a tiered replay": lambda builder: builder_lib.replay_tiers(builder) is not None,
}


@dataclasses.dataclass(frozen=True)
class RunKind:
    """A kind of run and the features it refuses.

    Attributes:
      name: as the docs' table names it.
      applies: whether the settings make a run of this kind.
      refuses: feature names (of SETTING_FEATURES or AGENT_FEATURES).
      refusal: the message; `{asked}` is filled with the features asked for, `{roles}`
        with the env's roles, and a setting's name (`{env_id}`) with its value.
      why: the docs' reason.
    """

    name: str
    applies: Callable[[Any], bool]
    refuses: tuple[str, ...]
    refusal: str
    why: str


KINDS = (
    RunKind(
        "num_learner_hosts > 1",
        lambda cfg: cfg.num_learner_hosts > 1,
        ("launcher=local", "launcher=launchpad", "learner_mode=gorila", "demos"),
        "num_learner_hosts={num_learner_hosts} is one sync learner of a process per host, "
        "which launcher=ray places; it does not take {asked}",
        "one sync learner of a process per host (a `jax.distributed` job), placed by Ray; "
        "it samples no demonstrations",
    ),
    RunKind(
        "learner_mode=gorila",
        lambda cfg: cfg.learner_mode == "gorila",
        ("max_nonfinite_steps, rollback_lr_factor or rollback_param_noise off its default",),
        "learner_mode=gorila does not take {asked}: a gradient worker drops a non-finite "
        "gradient before the shards see it, so there is nothing to roll back",
        "a worker drops a non-finite gradient (`dropped_nonfinite`) instead of rolling back",
    ),
    RunKind(
        "launcher=launchpad",
        lambda cfg: cfg.launcher == "launchpad",
        ("ray_address", "elastic_interval_s", "balance_remedy=replace"),
        "launcher=launchpad cannot do what {asked} asks (Ray clusters, adding or replacing "
        "actors while running); use launcher=ray",
        "Launchpad's program is fixed once launched and has no cluster address",
    ),
    RunKind(
        "learner_mode=federated",
        lambda cfg: cfg.learner_mode == "federated",
        (
            "num_replay_shards > 1",
            "num_learner_hosts > 1",
            "param_cache_per_host",
            "elastic_interval_s",
            # The DeepMind set, Launchpad's, has no dp-accounting.
            "launcher=launchpad",
            # Adding and removing actors wires them as a single-learner run's.
            "balance_remedy=replace",
            "demos",
            "a tiered replay",
            # A client's rollback would bring back its parameters of an older round.
            "max_nonfinite_steps, rollback_lr_factor or rollback_param_noise off its default",
        ),
        "learner_mode=federated does not support {asked} yet",
        "each client has its own replay and learner, wired apart from a single-learner run's",
    ),
    RunKind(
        "launcher=anakin",
        lambda cfg: cfg.launcher == "anakin",
        (
            "learner_mode=gorila",
            "learner_mode=federated",
            "num_learner_hosts > 1",
            "num_replay_shards > 1",
            "replay_backend=reverb, replay_port or a replay_cold setting",
            "demos",
            "a tiered replay",
            "param_cache_per_host",
            "elastic_interval_s",
            "balance_remedy=replace",
            "ray_address",
            "env_threads_per_actor above 1",
        ),
        "launcher=anakin does not take {asked}: its one learner acts in its own envs, with "
        "no replay, actor nodes or cluster (docs/anakin.md)",
        "one learner acts in its own JAX envs inside its compiled loop: no replay, actors "
        "or cluster",
    ),
    RunKind(
        "an env without a thread pool (`mpe/`, `gym:` ids)",
        lambda cfg: not envs.family(cfg.env_id).thread_pool,
        ("env_threads_per_actor above 1",),
        "{env_id} steps in the actor's own thread: {asked} asks for envpool's worker "
        "threads, which its envs do not have; run more actors instead (--num_actors)",
        "only envpool steps its envs in a pool of worker threads",
    ),
    RunKind(
        "a multi-agent env of several roles (role groups)",
        lambda cfg: bool(multiagent.roles_of(cfg.env_id)),
        (
            "learner_mode=federated",
            "launcher=launchpad",
            "num_learner_hosts > 1",
            "demos",
            "param_cache_per_host",
            # The actor count stays as launched (a control file is answered that it cannot
            # change), and data balance is off: it weighs one replay's writers.
            "elastic_interval_s",
            "stop_at_eval_return",
            # Under `local` every role's learner pmaps in one process: two programs of
            # cross-device collectives on the same devices at once can wait on each other
            # for ever (seen with 4 CPU devices: both learners and the actor stood still).
            "num_learner_devices above 1 with launcher=local",
            "a tiered replay",
        ),
        "{env_id} has several roles ({roles}); a run of role groups does not support "
        "{asked} yet (docs/multiagent.md)",
        "one actor acts for every role; each role has its own replay and learner",
    ),
)


def _refuse(kind: RunKind, cfg: Any, asked: list[str]) -> None:
    if asked:
        roles = ", ".join(sorted(multiagent.roles_of(cfg.env_id) or ()))
        raise ValueError(kind.refusal.format(**vars(cfg), asked=", ".join(asked), roles=roles))


def check_settings(cfg: Any) -> None:
    """Raises ValueError naming the features the settings ask of a kind of run that
    refuses them."""
    for kind in KINDS:
        if kind.applies(cfg):
            asked = [f for f in kind.refuses if f in SETTING_FEATURES and SETTING_FEATURES[f](cfg)]
            _refuse(kind, cfg, asked)


def check_agents(cfg: Any, builders: Sequence[builder_lib.AgentBuilder]) -> None:
    """Raises ValueError naming the features the run's agents ask of a kind of run that
    refuses them."""
    for kind in KINDS:
        if kind.applies(cfg):
            asked = [
                feature
                for feature in kind.refuses
                if feature in AGENT_FEATURES and any(AGENT_FEATURES[feature](b) for b in builders)
            ]
            _refuse(kind, cfg, asked)


def markdown_table() -> str:
    """The table for docs/flags.md: settings in code type, what an agent asks in words."""

    def shown(name: str) -> str:
        return f"`{name}`" if name in SETTING_FEATURES or "=" in name else name

    lines = ["| a run with | cannot have yet | because |", "|---|---|---|"]
    for kind in KINDS:
        refused = ", ".join(shown(feature) for feature in kind.refuses)
        lines.append(f"| {shown(kind.name)} | {refused} | {kind.why} |")
    return "\n".join(lines)
