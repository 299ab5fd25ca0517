"""Acting for several roles in one multi-agent environment (docs/multiagent.md).

A task such as `mpe/simple_tag_v3` has agents of several roles (predators and
prey). `RoleActorNode` steps `num_envs` copies of it; each role's policy acts
for that role's rows from that role's parameters, and each role's transitions
go to that role's replay through that role's adder. `RoleEvaluatorNode` plays
greedy episodes of every role's policy together and reports each role's return.
"""

from typing import Any

import jax
import numpy as np

from gorila_jax import builder as builder_lib
from gorila_jax import multiagent
from gorila_jax.acting import actor, evaluation, parts
from gorila_jax.acting.settings import ActorSettings
from gorila_jax.distributed import program
from gorila_jax.gorila import parameter_server


class _Roles:
    """An MPE task of several roles as the acting loop steps it: `send` holds each
    role's actions, `recv` steps every copy with them (info: none)."""

    def __init__(self, env: multiagent.MultiAgentVectorEnv):
        self.env, self._actions = env, None

    def reset(self) -> dict[str, np.ndarray]:
        return self.env.reset()

    def send(self, actions: dict[str, np.ndarray]) -> None:
        self._actions = actions

    def recv(self) -> dict[str, tuple]:
        return {role: (*stepped, {}) for role, stepped in self.env.step(self._actions).items()}

    def close(self) -> None:
        self.env.close()


class RoleActorNode(actor.ActingNode):
    """Acts for every role of a multi-agent task; each role's rows go to its own replay.

    Args:
      env_id: the task (`mpe/<name>`).
      roles: role -> `actor.RoleWiring`, one per role of the task.
      actor_index, num_actors, monitor, seed, settings, restored_counters: as
        `actor.ActingNode`'s. Env steps count agent rows; the counters have each role's
        part (`actor.role_counter`).
    """

    def __init__(
        self,
        env_id: str,
        roles: dict[str, actor.RoleWiring],
        actor_index: int,
        num_actors: int,
        monitor: program.Client | None,
        seed: int,
        settings: ActorSettings,
        restored_counters: dict[str, int] | None = None,
    ):
        task_roles = multiagent.role_specs(env_id)
        if set(roles) != set(task_roles):
            raise ValueError(
                f"{env_id} has roles {', '.join(task_roles)}; the actor was given "
                f"{', '.join(map(str, roles)) or 'none'}"
            )
        self.env_id = env_id
        super().__init__(roles, actor_index, num_actors, monitor, seed, settings, restored_counters)

    def _make_env(self) -> _Roles:
        return _Roles(
            multiagent.MultiAgentVectorEnv(self.env_id, self.settings.num_envs, self._env_seed)
        )


def run_role_episodes(
    env: multiagent.MultiAgentVectorEnv,
    policies: dict[str, builder_lib.Policy],
    params: dict[str, Any],
    key: jax.Array,
) -> dict[str, np.ndarray]:
    """One episode in each of `env`'s copies, every role acting with its own policy and
    parameters; returns each role's undiscounted return per agent row."""
    obs = env.reset()
    returns = {role: np.zeros(len(rows), np.float64) for role, rows in obs.items()}
    done = {role: np.zeros(len(rows), bool) for role, rows in obs.items()}
    keys = {role: parts.step_keys(jax.random.fold_in(key, i)) for i, role in enumerate(obs)}
    step = 0
    while not all(d.all() for d in done.values()):
        actions = {}
        for role in obs:
            action, _ = builder_lib.split_policy_output(
                policies[role](params[role], obs[role], next(keys[role]), step)
            )
            actions[role] = np.asarray(action)
        for role, (next_obs, reward, terminated, truncated) in env.step(actions).items():
            returns[role] += np.where(done[role], 0.0, reward)
            done[role] |= terminated | truncated
            obs[role] = next_obs
        step += 1
    return returns


def evaluate_roles(
    env_id: str,
    builders: dict[str, builder_lib.AgentBuilder],
    params: dict[str, Any],
    num_episodes: int,
    seed: int,
) -> dict[str, np.ndarray]:
    """Each role's returns (per agent row) over `num_episodes` greedy episodes of all roles."""
    specs = multiagent.role_specs(env_id)
    env = multiagent.MultiAgentVectorEnv(env_id, num_episodes, seed)
    try:
        policies = {
            role: builder.make_policy(specs[role], 0, 1, evaluation=True)
            for role, builder in builders.items()
        }
        on_device = {role: jax.device_put(p) for role, p in params.items()}
        return run_role_episodes(env, policies, on_device, jax.random.PRNGKey(seed))
    finally:
        env.close()


class RoleEvaluatorNode(evaluation.EvaluatingWorker):
    """`evaluation.EvaluatorNode` for a task of several roles: every `interval_s`, greedy
    episodes of all roles' newest parameters together, each role's return reported.

    A role's evaluation is recorded when any role has new parameters, with that
    role's parameter version; `stop(final_evaluation=True)` adds one at the end.
    """

    def __init__(
        self,
        env_id: str,
        roles: dict[str, actor.RoleWiring],
        monitor: program.Client,
        seed: int,
        num_episodes: int,
        interval_s: float,
    ):
        super().__init__()
        self.env_id = env_id
        self._builders = {role: wiring.builder for role, wiring in roles.items()}
        self._sources = {
            role: parameter_server.parameter_source(
                wiring.params_from, wiring.builder, wiring.spec, seed, f"evaluator/{role}"
            )
            for role, wiring in roles.items()
        }
        self._monitor = monitor
        self._seed, self._num_episodes, self._interval_s = seed, num_episodes, interval_s

    def run(self) -> None:
        specs = multiagent.role_specs(self.env_id)
        env = multiagent.MultiAgentVectorEnv(self.env_id, self._num_episodes, self._seed)
        policies = {
            role: builder.make_policy(specs[role], 0, 1, evaluation=True)
            for role, builder in self._builders.items()
        }
        key = jax.random.fold_in(jax.random.PRNGKey(self._seed), 2**20)
        evaluated: dict[str, int] = {}
        try:
            while not self.sleep(self._interval_s):
                evaluated = self._evaluate_newer(env, policies, key, evaluated, final=False)
            if self._final_evaluation:
                self._evaluate_newer(env, policies, key, evaluated, final=True)
        finally:
            env.close()
            self._finished.set()

    def _evaluate_newer(self, env, policies, key, evaluated: dict[str, int], final: bool):
        """Evaluates when some role has parameters newer than `evaluated` (past version 0
        unless `final`); returns the versions evaluated."""
        answers = {role: source.get_params() for role, source in self._sources.items()}
        versions = {role: version for role, (version, _) in answers.items()}
        newer = any(versions[role] > evaluated.get(role, -1) for role in versions)
        if not newer or (not final and not any(versions.values())):
            return evaluated
        params = {role: jax.device_put(p) for role, (_, p) in answers.items()}
        returns = run_role_episodes(env, policies, params, key)
        for role, role_returns in returns.items():
            self._monitor.report_eval(role_returns.tolist(), versions[role], role=role)
        return versions
