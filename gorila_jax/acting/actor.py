"""The actor node: a vector env, a jitted policy on a local parameter copy, an adder.

One acting loop, `ActingNode`, serves a task of one role (`ActorNode`: an envpool,
Gymnasium or one-role MPE env) and a task of several (`role_actor.RoleActorNode`: each
role's policy acts for that role's rows from that role's parameters, and writes to that
role's replay). A task of one role is the role `None`.
"""

import logging
import threading
import time
from typing import Any, NamedTuple

import jax
import numpy as np

from gorila_jax import builder as builder_lib
from gorila_jax import envs, replay, types
from gorila_jax.acting import parts
from gorila_jax.acting.parts import EpisodeTracker, ParameterPuller, actor_seeds, step_keys
from gorila_jax.acting.settings import ActorSettings
from gorila_jax.distributed import program
from gorila_jax.gorila import parameter_server
from gorila_jax.health import monitor as monitor_lib


class LimitedActing(program.Worker):
    """An acting node whose env steps the driver can cap near the end of the run's budget
    (`gorila_jax/run/budget.py`): its loop calls `at_env_step_limit` before each step,
    and ends at its settings' `max_env_steps` (`budget_spent`)."""

    def __init__(self, settings: ActorSettings):
        super().__init__()
        self.settings = settings
        self._env_step_limit: int | None = None
        self._limit_issued = -1
        self._limit_lock = threading.Lock()

    def env_steps_now(self) -> int:
        """This node's env steps this moment (its reports to the monitor lag by up to one
        heartbeat interval)."""
        raise NotImplementedError

    def limit_env_steps(self, limit: int | None, issued: int = 0) -> None:
        """Acts until its env steps reach `limit`, then waits, acting again if a later
        limit is higher (None: no limit). It may pass `limit` by less than one step of
        its envs.

        `issued` numbers the driver's limits: one that arrives after a later one (calls
        to a Ray actor run on several threads) is dropped.
        """
        with self._limit_lock:
            if issued >= self._limit_issued:
                self._limit_issued = issued
                self._env_step_limit = None if limit is None else int(limit)

    def budget_spent(self) -> bool:
        """Whether the node has acted its settings' `max_env_steps` (never at 0)."""
        return 0 < self.settings.max_env_steps <= self.env_steps_now()

    def at_env_step_limit(self) -> bool:
        """Whether the node is at its limit (then after a short wait: call it again)."""
        if self._env_step_limit is None or self.env_steps_now() < self._env_step_limit:
            return False
        self.sleep(0.02)
        return True


class RoleWiring(NamedTuple):
    """One role's part of an actor: its agent, its rows' spec, its replay and parameter
    source (handles in a program, clients in a running node)."""

    builder: builder_lib.AgentBuilder
    spec: types.EnvSpec
    replay: Any
    params_from: Any


def role_counter(counter: str, role: str | None) -> str:
    """The name of a role's part of an actor counter: `env_steps@prey`; a task of one
    role (`None`) counts under the counter's own name."""
    return counter if role is None else f"{counter}{program.ROLE_MARK}{role}"


class _RoleActing:
    """What an actor holds for one role: policy, parameters, adder, episodes, the step
    not yet written."""

    def __init__(self, role, wiring: RoleWiring, node: "ActingNode", key, restored, seed):
        self.role, self.builder, self.spec = role, wiring.builder, wiring.spec
        self.rows = node.settings.num_envs * wiring.spec.agents_per_env
        self.policy = wiring.builder.make_policy(
            wiring.spec, node.actor_index, node.num_actors, evaluation=False
        )
        # One key per step of the loop, not per env step: a step in which every env
        # resets adds no env step, and would repeat its predecessor's key.
        self.keys = step_keys(key)
        self.env_steps = int(restored.get(role_counter("env_steps", role), 0))
        self.episodes = EpisodeTracker(
            self.rows, int(restored.get(role_counter("episodes", role), 0))
        )
        self.valid = np.ones(self.rows, bool)
        source_name = node.name if role is None else f"{node.name}/{role}"
        self.source = parameter_server.parameter_source(
            wiring.params_from, wiring.builder, wiring.spec, seed, source_name
        )
        self.replay_node = replay.actor_shard(wiring.replay, node.actor_index)
        self.replay_endpoint = self.replay_node.endpoint()
        self.puller: ParameterPuller | None = None
        self.adder: Any = None
        self.unwritten: types.EnvStep | None = None

    @property
    def param_version(self) -> int:
        return self.puller.version if self.puller is not None else -1


class ActingNode(LimitedActing):
    """Steps a vector env in which each role's policy acts for that role's rows, and
    writes each role's steps to that role's replay.

    Parameters are pulled every `settings.param_pull_interval` actor steps (one step = one
    vectorized env step) as a future: acting goes on with the old parameters until the
    new ones arrive. The env is the roles' task as `parts.task_env` makes it.

    Args:
      roles: role -> `RoleWiring`; {None: ...} for a task of one role.
      actor_index: this actor's index; keys and env seeds derive from it.
      num_actors: how many actors the program has (for per-actor exploration).
      monitor: the monitor's client, or None.
      seed: root seed of the experiment.
      settings: how it acts (envs, pulls, heartbeats, threads; `ActorSettings`).
      restored_counters: this actor's counters when the run was checkpointed (see
        `counters`); env steps (the exploration schedule's position) and episodes
        continue from them.
    """

    def __init__(
        self,
        roles: dict[str | None, RoleWiring],
        actor_index: int,
        num_actors: int,
        monitor: program.Client | None,
        seed: int,
        settings: ActorSettings,
        restored_counters: dict[str, int] | None = None,
    ):
        super().__init__(settings)
        self.name = f"actor/{actor_index}"
        self.actor_index, self.num_actors = actor_index, num_actors
        self._monitor = monitor
        restored = dict(restored_counters or {})
        self._env_seed, policy_key = actor_seeds(
            seed, actor_index, int(restored.get("env_steps", 0))
        )
        one_role = set(roles) == {None}
        self._roles = {
            role: _RoleActing(
                role,
                wiring,
                self,
                policy_key if one_role else jax.random.fold_in(policy_key, i),
                restored,
                seed,
            )
            for i, (role, wiring) in enumerate(sorted(roles.items(), key=lambda r: str(r[0])))
        }

    def _make_env(self) -> parts.OneRole | parts.Roles:
        env_id = next(iter(self._roles.values())).spec.env_id  # every role's is the task's
        return parts.task_env(
            env_id, self.settings.num_envs, self._env_seed, num_threads=self.settings.env_threads
        )

    def run(self) -> None:
        # Beats from its own thread: a hung env shows as a stall, not a death.
        heartbeat = monitor_lib.Heartbeat(
            self._monitor, self.name, self.counters, self.settings.heartbeat_interval_s
        ).start()
        env = None
        try:
            env = self._make_env()
            for acting in self._roles.values():
                connection = replay.connect(acting.replay_node, acting.replay_endpoint)
                layout = acting.builder.replay_layout(acting.spec)
                acting.adder = layout.make_adder(connection, acting.rows, self._stop_event)
                acting.puller = ParameterPuller(acting.source, self.settings.param_pull_interval)
            self._act(env)
        except replay.Stopped:
            pass  # a rate limiter held our inserts while we were asked to stop
        finally:
            # Everything this node started ends here, before `wait_finished` says done
            # and the driver goes on to stop the replay: the writers' items are
            # confirmed while the server still serves.
            try:
                heartbeat.stop()
                for acting in self._roles.values():
                    for part in (acting.adder, acting.puller):
                        if part is not None:
                            part.close()
                if env is not None:
                    env.close()
                self._final_report()
            finally:
                self._finished.set()

    def _act(self, env: Any) -> None:
        """Steps the env, writing every role's steps to its replay, until stopped or out
        of budget."""
        obs = env.reset()
        last_report = time.monotonic()
        while not self.stopping and not self.budget_spent():
            if self.at_env_step_limit():
                continue
            actions, chosen = {}, {}
            for role, acting in self._roles.items():
                params, version = acting.puller.next_params(), acting.puller.version
                action, extras = builder_lib.split_policy_output(
                    acting.policy(params, obs[role], next(acting.keys), acting.env_steps)
                )
                actions[role] = np.asarray(action)
                chosen[role] = (actions[role], extras, version)
            # envpool steps the envs in its own thread while this one writes the
            # previous step to replay: the two costs overlap instead of adding up.
            env.send(actions)
            self._write_unwritten()
            stepped = env.recv()
            for role, acting in self._roles.items():
                action, extras, version = chosen[role]
                next_obs, reward, terminated, truncated, info = stepped[role]
                valid = acting.valid
                acting.unwritten = types.EnvStep(
                    obs[role],
                    action,
                    reward,
                    terminated,
                    truncated,
                    next_obs,
                    valid,
                    jax.tree.map(np.asarray, extras),  # None for policies without extras
                    version,
                    self.actor_index,
                )
                ended = valid & (terminated | truncated)
                raw_reward, game_over = envs.game_signals(reward, terminated, truncated, info)
                acting.episodes.update(raw_reward, valid & game_over, valid)
                acting.env_steps += int(valid.sum())
                acting.valid, obs[role] = ~ended, next_obs
            if time.monotonic() - last_report >= self.settings.heartbeat_interval_s:
                self._report(blocking=False)
                last_report = time.monotonic()
        if not self.stopping:
            self._write_unwritten()

    def _write_unwritten(self) -> None:
        for acting in self._roles.values():
            if acting.unwritten is not None:
                acting.adder.add(acting.unwritten)
                acting.unwritten = None

    def env_steps_now(self) -> int:
        return sum(acting.env_steps for acting in self._roles.values())

    def counters(self) -> dict[str, int]:
        """Env steps and finished episodes, and the parameter version acted with; a task
        of several roles has each role's part too (`role_counter`)."""
        counters = {
            "env_steps": self.env_steps_now(),
            "episodes": sum(acting.episodes.episodes for acting in self._roles.values()),
        }
        for role, acting in self._roles.items():
            if role is not None:
                counters[role_counter("env_steps", role)] = acting.env_steps
                counters[role_counter("episodes", role)] = acting.episodes.episodes
            counters[role_counter("param_version", role)] = acting.param_version
        return counters

    def _report(self, blocking: bool) -> None:
        if self._monitor is None:
            return
        report = self._monitor.report if blocking else self._monitor.futures.report
        returns = {role: acting.episodes.take_returns() for role, acting in self._roles.items()}
        if set(returns) == {None}:
            report(self.name, self.counters(), episode_returns=returns[None])
        else:
            report(self.name, self.counters(), role_returns=returns)

    def _final_report(self) -> None:
        # Blocking: the final checkpoint reads these counters from the monitor once
        # `wait_finished` says the actor is done.
        try:
            self._report(blocking=True)
        except Exception:  # noqa: BLE001  a monitor already gone only loses this report
            logging.exception("%s: final report to the monitor failed", self.name)


class ActorNode(ActingNode):
    """Acts in `settings.num_envs` copies of a task of one role (envpool's, Gymnasium's,
    an MPE task of one role) and writes what it sees to replay.

    Args:
      builder: the agent.
      spec: the environment's spec. A multi-agent task's copy gives
        `spec.agents_per_env` rows (one per agent); env steps count rows.
      replay_client, learner: clients of those nodes. `replay_client` may be the list
        of a sharded replay's shards: the actor writes to its assigned one,
        `replay.assigned_shard`; `learner` may be the Gorila shards or a cache.
      actor_index, num_actors, monitor, seed, settings, restored_counters: as
        `ActingNode`'s.
    """

    def __init__(
        self,
        builder: builder_lib.AgentBuilder,
        spec: types.EnvSpec,
        actor_index: int,
        num_actors: int,
        replay_client: program.Client | list[program.Client],
        learner: program.Client | list[program.Client],
        monitor: program.Client | None,
        seed: int,
        settings: ActorSettings,
        restored_counters: dict[str, int] | None = None,
    ):
        wiring = RoleWiring(builder, spec, replay_client, learner)
        super().__init__(
            {None: wiring}, actor_index, num_actors, monitor, seed, settings, restored_counters
        )
