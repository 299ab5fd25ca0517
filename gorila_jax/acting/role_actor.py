"""Acting for several roles in one multi-agent environment (docs/multiagent.md).

A task such as `mpe/simple_tag_v3` has agents of several roles (predators and
prey). `RoleActorNode` steps `num_envs` copies of it; each role's policy acts
for that role's rows from that role's parameters, and each role's transitions
go to that role's replay through that role's adder.
"""

from gorila_jax import multiagent
from gorila_jax.acting import actor
from gorila_jax.acting.settings import ActorSettings
from gorila_jax.distributed import program


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
        super().__init__(roles, actor_index, num_actors, monitor, seed, settings, restored_counters)
