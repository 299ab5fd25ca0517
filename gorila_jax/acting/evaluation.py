"""Greedy evaluation: full episodes with the evaluation policy, and the evaluator node."""

from typing import Any

import jax
import numpy as np

from gorila_jax import builder as builder_lib
from gorila_jax import types
from gorila_jax.acting import parts
from gorila_jax.distributed import program
from gorila_jax.gorila import parameter_server


def run_role_episodes(
    env: Any,
    policies: dict[Any, builder_lib.Policy],
    params: dict[Any, Any],
    key: jax.Array,
) -> dict[Any, np.ndarray]:
    """One episode in each of `env`'s copies, every role acting with its own policy and
    parameters; returns each role's undiscounted returns, one per row.

    `env` is stepped as a task of roles (`parts.OneRole`, `parts.Roles`). The
    policies get a fresh key from `key` at each step, as an actor's do (a task of one
    role: `key`'s own; of several: `fold_in(key, i)` for the i-th role).
    """
    obs = env.reset()
    returns = {role: np.zeros(len(rows), np.float64) for role, rows in obs.items()}
    done = {role: np.zeros(len(rows), bool) for role, rows in obs.items()}
    if set(obs) == {None}:
        keys = {None: parts.step_keys(key)}
    else:
        keys = {role: parts.step_keys(jax.random.fold_in(key, i)) for i, role in enumerate(obs)}
    step = 0
    while not all(role_done.all() for role_done in done.values()):
        actions = {}
        for role in obs:
            action, _ = builder_lib.split_policy_output(
                policies[role](params[role], obs[role], next(keys[role]), step)
            )
            actions[role] = np.asarray(action)
        for role, (next_obs, reward, terminated, truncated, _) in env.step(actions).items():
            returns[role] += np.where(done[role], 0.0, reward)
            done[role] |= terminated | truncated
            obs[role] = next_obs
        step += 1
    return returns


def run_episodes(env: Any, policy: builder_lib.Policy, params: Any, key: jax.Array) -> np.ndarray:
    """`run_role_episodes` of a vector env (a task of one role): the returns [E]."""
    return run_role_episodes(parts.OneRole(env), {None: policy}, {None: params}, key)[None]


def evaluate_task(
    env_id: str,
    builders: dict[Any, builder_lib.AgentBuilder],
    specs: dict[Any, types.EnvSpec],
    params: dict[Any, Any],
    num_episodes: int,
    seed: int,
) -> dict[Any, np.ndarray]:
    """Each role's returns (one per agent row) over `num_episodes` episodes of every
    role's evaluation policy acting together in `env_id` (`parts.task_env`); the roles of
    a task of one role: {None: ...}. A run's final evaluation."""
    env = parts.task_env(env_id, num_episodes, seed, evaluation=True)
    try:
        policies = {
            role: builder.make_policy(specs[role], 0, 1, evaluation=True)
            for role, builder in builders.items()
        }
        on_device = {role: jax.device_put(p) for role, p in params.items()}
        return run_role_episodes(env, policies, on_device, jax.random.PRNGKey(seed))
    finally:
        env.close()


def evaluate(
    builder: builder_lib.AgentBuilder,
    spec: types.EnvSpec,
    params: Any,
    num_episodes: int,
    seed: int,
) -> np.ndarray:
    """`evaluate_task` of a task of one role: the returns [num_episodes * agents_per_env]."""
    one = {None: builder}, {None: spec}, {None: params}
    return evaluate_task(spec.env_id, *one, num_episodes, seed)[None]


class EvaluatingWorker(program.Worker):
    """An evaluator's stop: `stop(final_evaluation=True)` asks `run` to evaluate the
    newest parameters once more before it returns (`_final_evaluation`)."""

    def __init__(self):
        super().__init__()
        self._final_evaluation = False

    def stop(self, final_evaluation: bool = False) -> None:
        """Asks `run` to return; with `final_evaluation`, after evaluating the newest parameters."""
        if final_evaluation:  # a later plain stop (the launcher's) does not cancel it
            self._final_evaluation = True
        super().stop()


class EvaluatingNode(EvaluatingWorker):
    """Evaluates the newest parameters every `interval_s`, and once at the run's end: of a
    task's one role, or of all its roles acting together in one env (`parts.task_env`).

    Each evaluation plays `num_episodes` greedy episodes and reports each role's
    returns to the monitor, with that role's parameter version. An evaluation runs when
    some role has parameters newer than those evaluated last; periodic ones skip version
    0 (the untrained network). `stop(final_evaluation=True)`, the driver's at the end of
    a run, adds one last evaluation of the newest parameters unless they were evaluated
    already: every run records an evaluation at its end whatever the machine's speed,
    even a run too short for a periodic one (then of version 0 if the learner has not
    stepped yet). `wait_finished` says when it is in the monitor's history, which the
    final checkpoint keeps.

    Args:
      roles: role -> `actor.RoleWiring` (its replay unused); {None: ...} for one role.
      monitor: the monitor's client.
      seed: root seed of the experiment.
      num_episodes: episodes per evaluation (env copies).
      interval_s: seconds between evaluations.
    """

    def __init__(
        self,
        roles: dict[Any, Any],
        monitor: program.Client,
        seed: int,
        num_episodes: int,
        interval_s: float,
    ):
        super().__init__()
        self._specs = {role: wiring.spec for role, wiring in roles.items()}
        self._builders = {role: wiring.builder for role, wiring in roles.items()}
        self._sources = {
            role: parameter_server.parameter_source(
                wiring.params_from,
                wiring.builder,
                wiring.spec,
                seed,
                "evaluator" if role is None else f"evaluator/{role}",
            )
            for role, wiring in roles.items()
        }
        self._monitor = monitor
        self._seed, self._num_episodes, self._interval_s = seed, num_episodes, interval_s

    def _make_env(self) -> parts.OneRole | parts.Roles:
        env_id = next(iter(self._specs.values())).env_id  # every role's is the task's
        return parts.task_env(
            env_id, self._num_episodes, self._seed, evaluation=True, num_threads=1
        )

    def run(self) -> None:
        env = self._make_env()
        try:
            policies = {
                role: builder.make_policy(self._specs[role], 0, 1, evaluation=True)
                for role, builder in self._builders.items()
            }
            key = jax.random.fold_in(jax.random.PRNGKey(self._seed), 2**20)
            evaluated: dict[Any, int] = {}
            while not self.sleep(self._interval_s):
                evaluated = self._evaluate_newer(env, policies, key, evaluated, final=False)
            if self._final_evaluation:
                self._evaluate_newer(env, policies, key, evaluated, final=True)
        finally:
            env.close()
            self._finished.set()

    def _evaluate_newer(self, env, policies, key, evaluated: dict[Any, int], final: bool):
        """Evaluates when some role has parameters newer than `evaluated` (past version 0
        unless `final`); returns the versions evaluated."""
        # A source answers None when it has nothing newer: no parameters cross for it.
        answers = {
            role: source.get_params(
                evaluated.get(role, -1) if final else max(evaluated.get(role, -1), 0)
            )
            for role, source in self._sources.items()
        }
        if all(answer is None for answer in answers.values()):
            return evaluated
        for role, answer in answers.items():
            if answer is None:  # not newer, but every role acts in the episodes
                answers[role] = self._sources[role].get_params()
        versions = {role: version for role, (version, _) in answers.items()}
        params = {role: jax.device_put(p) for role, (_, p) in answers.items()}
        returns = run_role_episodes(env, policies, params, key)
        for role, role_returns in returns.items():
            self._monitor.report_eval(role_returns.tolist(), versions[role], role=role)
        return versions
