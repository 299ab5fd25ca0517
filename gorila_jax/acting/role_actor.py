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
from gorila_jax.acting import actor, evaluation
from gorila_jax.acting.settings import ActorSettings
from gorila_jax.distributed import program


class Roles:
    """An MPE task of several roles as the acting and evaluation loops step it: `send`
    holds each role's actions, `recv` steps every copy with them; `step` does both
    (info: none)."""

    def __init__(self, env: multiagent.MultiAgentVectorEnv):
        self.env, self._actions = env, None

    def reset(self) -> dict[str, np.ndarray]:
        return self.env.reset()

    def send(self, actions: dict[str, np.ndarray]) -> None:
        self._actions = actions

    def recv(self) -> dict[str, tuple]:
        return self.step(self._actions)

    def step(self, actions: dict[str, np.ndarray]) -> dict[str, tuple]:
        return {role: (*stepped, {}) for role, stepped in self.env.step(actions).items()}

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

    def _make_env(self) -> Roles:
        return Roles(
            multiagent.MultiAgentVectorEnv(self.env_id, self.settings.num_envs, self._env_seed)
        )


def evaluate_roles(
    env_id: str,
    builders: dict[str, builder_lib.AgentBuilder],
    params: dict[str, Any],
    num_episodes: int,
    seed: int,
) -> dict[str, np.ndarray]:
    """Each role's returns (per agent row) over `num_episodes` greedy episodes of all roles."""
    specs = multiagent.role_specs(env_id)
    env = Roles(multiagent.MultiAgentVectorEnv(env_id, num_episodes, seed))
    try:
        policies = {
            role: builder.make_policy(specs[role], 0, 1, evaluation=True)
            for role, builder in builders.items()
        }
        on_device = {role: jax.device_put(p) for role, p in params.items()}
        return evaluation.run_role_episodes(env, policies, on_device, jax.random.PRNGKey(seed))
    finally:
        env.close()


class RoleEvaluatorNode(evaluation.EvaluatingNode):
    """The evaluator of a task of several roles: greedy episodes of all roles' newest
    parameters together, each role's return reported (`evaluation.EvaluatingNode`).

    Args:
      env_id: the task (`mpe/<name>`).
      roles: role -> `actor.RoleWiring` (its replay unused).
      monitor, seed, num_episodes, interval_s: as `evaluation.EvaluatingNode`'s.
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
        super().__init__(roles, monitor, seed, num_episodes, interval_s)
        self.env_id = env_id

    def _make_env(self) -> Roles:
        return Roles(multiagent.MultiAgentVectorEnv(self.env_id, self._num_episodes, self._seed))
