"""What a run runs: one task (one agent on one env spec) or role groups (a multi-agent env
of several roles, one agent per role, `role_program`).

The driver (experiment.py) goes through one interface, `Task`, and never branches on
which it has: the choice is made once, in `task_of`.
"""

import dataclasses
import functools
from typing import Any, Callable, Protocol

from gorila_jax import builder as builder_lib
from gorila_jax import envs, types
from gorila_jax.acting import evaluation
from gorila_jax.distributed import program as program_lib
from gorila_jax.health import balance
from gorila_jax.learning import checkpoint
from gorila_jax.run import elastic, learning_modes, live_actors, role_program, wiring
from gorila_jax.run.experiment_config import ExperimentConfig
from gorila_jax.run.wiring import make_program

Builders = builder_lib.AgentBuilder | dict[str, builder_lib.AgentBuilder]


class Task(Protocol):
    """One run's program and its ends, whatever its shape."""

    def check(self, agents_taking_demos: tuple[str, ...]) -> None:
        """Raises ValueError naming a setting this task cannot run with."""

    def agent_configs(self) -> Any:
        """The agent's config (a run of role groups: each role's), for experiment trackers."""

    def prepare(self) -> program_lib.Program:
        """Readies the logdir (a resume's checkpoints, or none of an earlier run) and
        builds the program."""

    def resume_meta(self) -> dict[str, Any]:
        """The restored checkpoint's meta (counters, the monitor's state); {} when new."""

    def resumed_from(self) -> Any:
        """The learner step a resume started from (per role); None when new."""

    def actor_scaler(self, running: Any) -> elastic.ActorScaler:
        """The driver's hand on the actor count."""

    def fetch_final_params(self, running: Any) -> None:
        """Takes the final parameters from the stopped program (before it is torn down)."""

    def outcome(
        self, reason: str, stop_failure: str | None, snapshot: dict[str, Any]
    ) -> dict[str, Any]:
        """The summary's final parameters version, greedy evaluation and agent config
        (`snapshot`: the monitor's last)."""


def task_of(builder: Builders, cfg: ExperimentConfig) -> Task:
    """The task `cfg.env_id` makes of `builder` (one builder, or one per role)."""
    builders = wiring.role_builders(builder, cfg.env_id)
    if None in builders:
        return OneTask(builders[None], cfg)
    return RoleGroups(builders, cfg)


class OneTask:
    """One agent on one env spec: a learner (sync, multi-host, Gorila or federated)."""

    def __init__(self, builder: builder_lib.AgentBuilder, cfg: ExperimentConfig):
        self._builder, self._cfg = builder, cfg
        self._resume: checkpoint.Restored | None = None
        self._final: tuple[int, Any] | None = None

    @functools.cached_property
    def _spec(self) -> types.EnvSpec:
        return envs.env_spec(self._cfg.env_id)

    def check(self, agents_taking_demos: tuple[str, ...]) -> None:
        wiring.check_program(self._builder, self._cfg, self._spec, agents_taking_demos)

    def agent_configs(self) -> Any:
        return self._builder.config

    def prepare(self) -> program_lib.Program:
        builder, cfg = self._builder, self._cfg
        template = wiring.checkpoint_template(builder, cfg, self._spec)
        need_replay = learning_modes.of(cfg).replay_beside_checkpoint
        self._resume = checkpoint.prepare_logdir(
            cfg.logdir, cfg.resume, builder, cfg, template, need_replay
        )
        return make_program(builder, cfg, self._spec, self._resume)

    def resume_meta(self) -> dict[str, Any]:
        return self._resume.meta if self._resume else {}

    def resumed_from(self) -> int | None:
        return self._resume.step if self._resume else None

    def actor_scaler(self, running: Any) -> elastic.ActorScaler:
        """Control file, elastic policy, data balance."""
        builder, cfg = self._builder, self._cfg
        if learning_modes.of(cfg).acts_itself:
            # Its actors live in its compiled loop (each with its envs and policy), not as nodes.
            in_loop = [f"actor/{index}" for index in range(cfg.num_actors)]
            return fixed_actors(
                running, cfg, "an Anakin run has no actor nodes to add or remove", lambda: in_loop
            )
        tracker = None
        if cfg.balance_interval_s:
            tracker = balance.BalanceTracker(cfg.balance_factor, cfg.balance_interval_s)
        return elastic.ActorScaler(
            cfg.logdir,
            functools.partial(live_actors.add_actor, running, builder, cfg, self._spec),
            functools.partial(live_actors.remove_actor, running),
            lambda: [node.name for node in running.active_nodes("actor")],
            cfg.actor_count_floor,
            cfg.max_actors,
            cfg.elastic_policy,
            tracker,
            cfg.balance_remedy == "replace",
            apply_existing=cfg.resume,
            sample_weights=(
                functools.partial(live_actors.set_sample_weights, running)
                if cfg.balance_remedy == "downweight"
                else None
            ),
            balance_weight=cfg.balance_weight,
        )

    def fetch_final_params(self, running: Any) -> None:
        mode = learning_modes.of(self._cfg)
        self._final = mode.final_params(running, self._builder, self._cfg, self._spec)

    def outcome(
        self, reason: str, stop_failure: str | None, snapshot: dict[str, Any]
    ) -> dict[str, Any]:
        builder, cfg = self._builder, self._cfg
        version, params = self._final
        if cfg.saves_checkpoints and not stop_failure:
            where = checkpoint.checkpoint_root(cfg.logdir)
            print(f"checkpoint: learner step {version:,} in {where}", flush=True)
        final_returns = None  # an interrupted run skips the final evaluation
        if reason != "interrupted":
            final_returns = evaluation.evaluate(
                builder, self._spec, params, cfg.eval_episodes, cfg.seed + 1
            )
        return {
            "params_version": version,
            "final_eval_return": None if final_returns is None else float(final_returns.mean()),
            "final_eval_episodes": 0 if final_returns is None else len(final_returns),
            "agent_config": dataclasses.asdict(builder.config),
        }


class RoleGroups:
    """A multi-agent env of several roles: per role a replay and a learner (or Gorila
    workers and shards), with actors and an evaluator acting for every role."""

    def __init__(self, builders: dict[str, builder_lib.AgentBuilder], cfg: ExperimentConfig):
        self._builders, self._cfg = builders, cfg
        self._resume: dict[str, checkpoint.Restored] | None = None
        self._final: dict[str, tuple[int, Any]] | None = None

    def check(self, agents_taking_demos: tuple[str, ...]) -> None:
        role_program.check_run(self._builders, self._cfg)

    def agent_configs(self) -> dict[str, Any]:
        return {role: builder.config for role, builder in self._builders.items()}

    def prepare(self) -> program_lib.Program:
        self._resume = role_program.prepare_logdir(self._builders, self._cfg)
        return make_program(self._builders, self._cfg, resume=self._resume)

    def resume_meta(self) -> dict[str, Any]:
        return wiring.newest_meta(self._resume)

    def resumed_from(self) -> dict[str, int] | None:
        return {role: r.step for role, r in self._resume.items()} if self._resume else None

    def actor_scaler(self, running: Any) -> elastic.ActorScaler:
        """A run whose actor count cannot change (`fixed_actors`)."""
        return fixed_actors(
            running, self._cfg, "a run of role groups cannot add or remove actors yet"
        )

    def fetch_final_params(self, running: Any) -> None:
        self._final = role_program.final_params(running, self._builders, self._cfg)

    def outcome(
        self, reason: str, stop_failure: str | None, snapshot: dict[str, Any]
    ) -> dict[str, Any]:
        final = role_program.final_evaluation(self._builders, self._cfg, self._final, reason)
        return {
            "params_version": {role: version for role, (version, _) in self._final.items()},
            "final_eval_return": None,  # each role's is in "roles"
            "final_eval_episodes": 0,
            "roles": {role: {**snapshot["roles"][role], **final[role]} for role in final},
            "agent_config": {
                role: dataclasses.asdict(builder.config) for role, builder in self._builders.items()
            },
        }


def fixed_actors(
    running: Any,
    cfg: ExperimentConfig,
    why: str,
    actors: Callable[[], list[str]] | None = None,
) -> elastic.ActorScaler:
    """The scaler of a run whose actor count cannot change: a control file asking for
    another count is answered `why`. `actors` names the acting actors (default: the
    program's actor nodes)."""

    def cannot(*_: Any) -> None:
        raise ValueError(why)

    return elastic.ActorScaler(
        cfg.logdir,
        cannot,
        cannot,
        actors or (lambda: [node.name for node in running.active_nodes("actor")]),
        cfg.actor_count_floor,
        cfg.max_actors,
        cfg.elastic_policy,
        None,
        False,
    )
