"""What a run of a multi-agent task with several roles adds to a plain run: its checks,
a config and checkpoints per role, each role's final parameters and evaluation, and each
role's metric columns. Its program is `wiring.make_program`'s.

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

from typing import Any

from gorila_jax import builder as builder_lib
from gorila_jax import multiagent
from gorila_jax.acting import evaluation
from gorila_jax.gorila import mode
from gorila_jax.learning import checkpoint
from gorila_jax.run import combinations, learning_modes, wiring
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
            learning_modes.of(cfg).check_agent(builder, specs[role], cfg)
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
    returns = evaluation.evaluate_task(
        cfg.env_id,
        builders,
        multiagent.role_specs(cfg.env_id),
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
