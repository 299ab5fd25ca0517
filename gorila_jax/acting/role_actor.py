"""Acting for several roles in one multi-agent environment (docs/multiagent.md).

A task such as `mpe/simple_tag_v3` has agents of several roles (predators and
prey). `RoleActorNode` steps `num_envs` copies of it; each role's policy acts
for that role's rows from that role's parameters, and each role's transitions
go to that role's replay through that role's adder. `RoleEvaluatorNode` plays
greedy episodes of every role's policy together and reports each role's return.
"""

import logging
import time
from typing import Any, NamedTuple

import jax
import numpy as np

from gorila_jax import builder as builder_lib
from gorila_jax import multiagent, replay, types
from gorila_jax.acting import actor, evaluation
from gorila_jax.acting.settings import ActorSettings
from gorila_jax.distributed import program
from gorila_jax.gorila import parameter_server
from gorila_jax.health import monitor as monitor_lib


class RoleWiring(NamedTuple):
    """One role's part of an actor: its agent, its rows' spec, its replay and parameter
    source (handles in a program, clients in a running node)."""

    builder: builder_lib.AgentBuilder
    spec: types.EnvSpec
    replay: Any
    params_from: Any


def role_counter(counter: str, role: str) -> str:
    """The name of a role's part of an actor counter: `env_steps@prey`."""
    return f"{counter}{program.ROLE_MARK}{role}"


class _RoleActing:
    """What an actor holds for one role: policy, parameters, adder, episode returns."""

    def __init__(self, role: str, wiring: RoleWiring, node: "RoleActorNode", key: jax.Array):
        self.role, self.builder, self.spec = role, wiring.builder, wiring.spec
        self.rows = node.num_envs * wiring.spec.agents_per_env
        self.policy = wiring.builder.make_policy(
            wiring.spec, node.actor_index, node.num_actors, evaluation=False
        )
        self.keys = actor.step_keys(key)
        self.env_steps = int(node.restored.get(role_counter("env_steps", role), 0))
        self.episodes = actor.EpisodeTracker(
            self.rows, int(node.restored.get(role_counter("episodes", role), 0))
        )
        self.valid = np.ones(self.rows, bool)
        self.puller: actor.ParameterPuller | None = None
        self.adder: Any = None


class RoleActorNode(actor.LimitedActing):
    """Acts for every role of a multi-agent task; each role's rows go to its own replay.

    Args:
      env_id: the task (`mpe/<name>`).
      roles: role -> `RoleWiring`, one per role of the task.
      actor_index, num_actors, monitor, seed, settings, restored_counters: as
        `actor.ActorNode`'s. Env steps count agent rows; the counters have each role's
        part (`role_counter`).
    """

    def __init__(
        self,
        env_id: str,
        roles: dict[str, RoleWiring],
        actor_index: int,
        num_actors: int,
        monitor: program.Client | None,
        seed: int,
        settings: ActorSettings,
        restored_counters: dict[str, int] | None = None,
    ):
        super().__init__(settings)
        task_roles = multiagent.role_specs(env_id)
        if set(roles) != set(task_roles):
            raise ValueError(
                f"{env_id} has roles {', '.join(task_roles)}; the actor was given "
                f"{', '.join(roles) or 'none'}"
            )
        self.name = f"actor/{actor_index}"
        self.env_id, self.actor_index, self.num_actors = env_id, actor_index, num_actors
        self.num_envs = settings.num_envs
        self._monitor = monitor
        self.restored = dict(restored_counters or {})
        env_steps = int(self.restored.get("env_steps", 0))
        self._env_seed, policy_key = actor.actor_seeds(seed, actor_index, env_steps)
        self._wiring = roles
        self._roles = {
            role: _RoleActing(role, wiring, self, jax.random.fold_in(policy_key, i))
            for i, (role, wiring) in enumerate(sorted(roles.items()))
        }
        self._sources = {
            role: parameter_server.parameter_source(
                wiring.params_from, wiring.builder, wiring.spec, seed, f"{self.name}/{role}"
            )
            for role, wiring in roles.items()
        }

    def run(self) -> None:
        heartbeat = monitor_lib.Heartbeat(
            self._monitor, self.name, self.counters, self._settings.heartbeat_interval_s
        ).start()
        env = None
        try:
            env = multiagent.MultiAgentVectorEnv(self.env_id, self.num_envs, self._env_seed)
            for role, acting in self._roles.items():
                shard = replay.actor_shard(self._wiring[role].replay, self.actor_index)
                acting.adder = acting.builder.replay_layout(acting.spec).make_adder(
                    replay.connect(shard), acting.rows, self._stop_event
                )
                acting.puller = actor.ParameterPuller(
                    self._sources[role], self._settings.param_pull_interval
                )
            self._act(env)
        except replay.Stopped:
            pass  # a rate limiter held our inserts while we were asked to stop
        finally:
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

    def _act(self, env: multiagent.MultiAgentVectorEnv) -> None:
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
                chosen[role] = (actions[role], jax.tree.map(np.asarray, extras), version)
            stepped = env.step(actions)
            for role, acting in self._roles.items():
                action, extras, version = chosen[role]
                next_obs, reward, terminated, truncated = stepped[role]
                valid = acting.valid
                acting.adder.add(
                    types.EnvStep(
                        obs[role],
                        action,
                        reward,
                        terminated,
                        truncated,
                        next_obs,
                        valid,
                        extras,
                        version,
                        self.actor_index,
                    )
                )
                ended = valid & (terminated | truncated)
                acting.episodes.update(reward, ended, valid)
                acting.env_steps += int(valid.sum())
                acting.valid = ~ended
                obs[role] = next_obs
            if time.monotonic() - last_report >= self._settings.heartbeat_interval_s:
                self._report(blocking=False)
                last_report = time.monotonic()

    def env_steps_now(self) -> int:
        return sum(acting.env_steps for acting in self._roles.values())

    def counters(self) -> dict[str, int]:
        """Env steps and episodes in all and per role, and each role's parameter version."""
        counters = {
            "env_steps": self.env_steps_now(),
            "episodes": sum(acting.episodes.episodes for acting in self._roles.values()),
        }
        for role, acting in self._roles.items():
            counters[role_counter("env_steps", role)] = acting.env_steps
            counters[role_counter("episodes", role)] = acting.episodes.episodes
            version = acting.puller.version if acting.puller is not None else -1
            counters[role_counter("param_version", role)] = version
        return counters

    def _report(self, blocking: bool) -> None:
        if self._monitor is None:
            return
        returns = {role: acting.episodes.take_returns() for role, acting in self._roles.items()}
        report = self._monitor.report if blocking else self._monitor.futures.report
        report(self.name, self.counters(), role_returns=returns)

    def _final_report(self) -> None:
        # Blocking: the final checkpoint reads these counters once `wait_finished` says done.
        try:
            self._report(blocking=True)
        except Exception:  # noqa: BLE001  a monitor already gone only loses this report
            logging.exception("%s: final report to the monitor failed", self.name)


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
    keys = {role: actor.step_keys(jax.random.fold_in(key, i)) for i, role in enumerate(obs)}
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
        roles: dict[str, RoleWiring],
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
