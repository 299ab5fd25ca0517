"""The program of a multi-agent task with several roles: one group per role.

Role r of `mpe/simple_tag_v3` (predators `adversary`, prey `agent`) has its own
replay (`replay@r/...`), its own learner (`learner@r/0`) or, in Gorila mode, its
own gradient workers and parameter-server shards (`gradient_worker@r/i`,
`parameter_server@r/j`), its own agent and parameters. Actors (`actor/i`,
`role_actor.RoleActorNode`) step the shared environment; each role's policy
acts for that role's agents and each role's transitions go to that role's
replay. The monitor, the evaluator and the actors are shared. A role's config
and checkpoints live in `<logdir>/roles/<role>/` (`checkpoint.role_logdir`), so
a restarted learner of one role resumes from that role's checkpoint while the
other roles go on. docs/multiagent.md has the rest.
"""

import dataclasses
from typing import Any

from gorila_jax import builder as builder_lib
from gorila_jax import multiagent
from gorila_jax.acting import actor, role_actor
from gorila_jax.distributed import program as program_lib
from gorila_jax.gorila import mode
from gorila_jax.health import monitor
from gorila_jax.learning import checkpoint
from gorila_jax.run import combinations, learning_modes, replay_wiring, wiring
from gorila_jax.run.experiment_config import ExperimentConfig


def check_run(builders: dict[str, builder_lib.AgentBuilder], cfg: ExperimentConfig) -> None:
    """Raises ValueError for an agent a run of role groups cannot take yet, or a builder
    per role that does not fit its role's agents (saying which role)."""
    specs = multiagent.role_specs(cfg.env_id)
    if set(builders) != set(specs):
        raise ValueError(
            f"{cfg.env_id} has roles {', '.join(sorted(specs))}; got agents for "
            f"{', '.join(sorted(builders)) or 'none'}"
        )
    # What a run of role groups cannot do yet, of the settings alone, was refused as they
    # were validated (combinations.py); of the agents, here.
    combinations.check_agents(cfg, list(builders.values()))
    for role, builder in builders.items():
        try:
            builder.validate(cfg.num_learner_devices or 1, specs[role])
            cfg.check_budget(builder)
            learning_modes.of(cfg).check_agent(builder, specs[role])
            cfg.replay_tiering(builder, specs[role])  # raises for cold settings without tiers
        except ValueError as error:
            raise ValueError(f"role {role}: {error}") from None


def prepare_logdir(
    builders: dict[str, builder_lib.AgentBuilder], cfg: ExperimentConfig
) -> dict[str, checkpoint.Restored] | None:
    """Each role's config.json (its agent's own) in its role directory; with `cfg.resume`,
    each role's newest usable checkpoint, else no checkpoints of an earlier run.

    Raises:
      checkpoint.CheckpointError: resuming, a role without a usable checkpoint.
    """
    specs = multiagent.role_specs(cfg.env_id)
    restored = {
        role: checkpoint.prepare_logdir(
            checkpoint.role_logdir(cfg.logdir, role),
            cfg.resume,
            builder,
            cfg,
            wiring.checkpoint_template(builder, cfg, specs[role]),
        )
        for role, builder in builders.items()
    }
    return restored if cfg.resume else None


def newest_meta(resume: dict[str, checkpoint.Restored] | None) -> dict[str, Any]:
    """The meta of the roles' newest checkpoint (the monitor's state, every node's
    counters, at the latest time any role saved); {} for a new run."""
    if not resume:
        return {}
    return max((r.meta for r in resume.values()), key=lambda meta: meta.get("unix_time", 0))


def make_program(
    builders: dict[str, builder_lib.AgentBuilder],
    cfg: ExperimentConfig,
    resume: dict[str, checkpoint.Restored] | None = None,
) -> program_lib.Program:
    """The graph: a monitor; per role a replay and a learner (or Gorila workers and
    shards); actors and an evaluator acting for every role.

    With `resume`, each role's replay and learner (or shards) start from that role's
    checkpoint, and the monitor and actors from the newest role checkpoint's meta.
    """
    specs = multiagent.role_specs(cfg.env_id)
    meta = newest_meta(resume)
    restored_counters = meta.get("node_counters", {})
    learning_cfg = cfg
    if cfg.launcher == "local":
        # One device each (not all of them, the default): see `check_run`.
        learning_cfg = dataclasses.replace(cfg, num_learner_devices=1)
    program = program_lib.Program("roles")
    with program.group("monitor", program_lib.Resources(num_cpus=0)):
        monitor_node = program.add_node(monitor.MonitorNode, restored=meta, roles=tuple(builders))
    roles = {}
    for role in sorted(builders):
        builder, spec = builders[role], specs[role]
        restore_step = resume[role].step if resume else None
        replay_nodes = replay_wiring.add_replay_shards(
            program, builder, cfg, spec, restore_step, role
        )
        sources = wiring.add_learning(
            program,
            builder,
            learning_cfg,
            spec,
            (replay_nodes, monitor_node),
            restore_step,
            restored_counters,
            role,
        )
        # Every actor of a role reads one source (role groups refuse federated runs).
        roles[role] = actor.RoleWiring(builder, spec, replay_nodes, sources.evaluator)
    if cfg.eval_interval_s > 0:
        with program.group("evaluator", program_lib.Resources(num_cpus=0)):
            program.add_node(
                role_actor.RoleEvaluatorNode,
                cfg.env_id,
                roles,
                monitor_node,
                cfg.seed,
                cfg.eval_episodes,
                cfg.eval_interval_s,
            )
    with program.group("actor", program_lib.Resources(cfg.cpus_per_actor)):
        for index in range(cfg.num_actors):
            handle = program.add_node(
                role_actor.RoleActorNode,
                cfg.env_id,
                roles,
                index,
                cfg.num_actors,
                monitor_node,
                cfg.seed,
                cfg.actor_settings(),
                restored_counters=wiring.int_counters(restored_counters.get(f"actor/{index}")),
            )
            program.node(handle.name).restartable(monitor.continue_counters)
    return program


def final_params(
    running: Any, builders: dict[str, builder_lib.AgentBuilder], cfg: ExperimentConfig
) -> dict[str, tuple[int, Any]]:
    """Each role's (version, parameters): from its learner, or assembled from its shards."""
    specs, mode = multiagent.role_specs(cfg.env_id), learning_modes.of(cfg)
    return {
        role: mode.final_params(running, builder, cfg, specs[role], role)
        for role, builder in builders.items()
    }


def final_evaluation(
    builders: dict[str, builder_lib.AgentBuilder],
    cfg: ExperimentConfig,
    params: dict[str, tuple[int, Any]],
    reason: str,
) -> dict[str, dict[str, Any]]:
    """Each role's final greedy return per agent (all roles acting greedily together)."""
    if reason == "interrupted":
        return {role: {"final_eval_return": None, "final_eval_episodes": 0} for role in builders}
    returns = role_actor.evaluate_roles(
        cfg.env_id,
        builders,
        {role: p for role, (_, p) in params.items()},
        cfg.eval_episodes,
        cfg.seed + 1,
    )
    return {
        role: {"final_eval_return": float(r.mean()), "final_eval_episodes": cfg.eval_episodes}
        for role, r in returns.items()
    }


def row_fields(snapshot: dict[str, Any]) -> dict[str, float]:
    """A metrics row's per-role columns: `<role>/mean_return`, `<role>/eval_return`, ...,
    and in Gorila mode each role's run-wide Gorila figures (`<role>/gradients_applied`)."""
    fields = {}
    for role, figures in snapshot.get("roles", {}).items():
        prefix = f"{role}/"
        own_metrics = {
            key.removeprefix(prefix): value
            for key, value in snapshot["metrics"].items()
            if key.startswith(prefix)
        }
        for name, value in {**figures, **mode.summarize(own_metrics)}.items():
            fields[prefix + name] = value
    return fields


def progress_suffix(row: dict[str, Any], roles: tuple[str, ...]) -> str:
    """The progress line's role part: each role's training and evaluation return, updates,
    and in Gorila mode the gradients its shards applied."""
    parts = []
    for role in roles:
        part = (
            f" | {role}: return {row[f'{role}/mean_return']:.2f} eval "
            f"{row[f'{role}/eval_return']:.2f} updates {row[f'{role}/learner_steps']:,d}"
        )
        if f"{role}/gradients_applied" in row:
            part += f" applied {row[f'{role}/gradients_applied']:,.0f}"
        parts.append(part)
    return "".join(parts)
