"""Greedy evaluation: full episodes with the evaluation policy, and the evaluator node."""

from typing import Any

import jax
import numpy as np

from gorila_jax import builder as builder_lib
from gorila_jax import envs, types
from gorila_jax.acting import parts
from gorila_jax.distributed import program
from gorila_jax.gorila import parameter_server


def run_episodes(env: Any, policy: builder_lib.Policy, params: Any, key: jax.Array) -> np.ndarray:
    """Plays one episode in each of `env`'s envs; returns their undiscounted returns [E].

    The policy gets a fresh key from `key` at each step, as an actor's does.
    """
    obs, _ = env.reset()
    num_envs = obs.shape[0]
    returns = np.zeros(num_envs, np.float64)
    done = np.zeros(num_envs, bool)
    keys = parts.step_keys(key)
    step = 0
    while not done.all():
        action, _ = builder_lib.split_policy_output(policy(params, obs, next(keys), step))
        action = np.asarray(action)
        obs, reward, terminated, truncated, _ = env.step(action)
        returns += np.where(done, 0.0, reward)
        done |= terminated | truncated
        step += 1
    return returns


def evaluate(
    builder: builder_lib.AgentBuilder,
    spec: types.EnvSpec,
    params: Any,
    num_episodes: int,
    seed: int,
) -> np.ndarray:
    """Returns of `num_episodes` episodes of the agent's evaluation policy."""
    env = envs.make_env(spec.env_id, num_episodes, seed=seed, evaluation=True)
    try:
        policy = builder.make_policy(spec, 0, 1, evaluation=True)
        return run_episodes(env, policy, jax.device_put(params), jax.random.PRNGKey(seed))
    finally:
        env.close()


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


class EvaluatorNode(EvaluatingWorker):
    """Evaluates the learner's newest parameters every `interval_s`, and once at the run's end.

    Each evaluation plays `num_episodes` greedy episodes and reports their
    returns to the monitor, with the parameter version. Periodic evaluations
    skip version 0 (the untrained network) and versions already evaluated.
    `stop(final_evaluation=True)`, the driver's at the end of a run, adds
    one last evaluation of the newest parameters unless they were evaluated
    already: every run records an evaluation at its end whatever the
    machine's speed, even a run too short for a periodic one (then of
    version 0 if the learner has not stepped yet). `wait_finished` says
    when it is in the monitor's history, which the final checkpoint keeps.
    """

    def __init__(
        self,
        builder: builder_lib.AgentBuilder,
        spec: types.EnvSpec,
        learner: program.Client | list[program.Client],
        monitor: program.Client,
        seed: int,
        num_episodes: int,
        interval_s: float,
    ):
        super().__init__()
        self._builder, self._spec = builder, spec
        self._learner = parameter_server.parameter_source(learner, builder, spec, seed, "evaluator")
        self._monitor = monitor
        self._seed, self._num_episodes, self._interval_s = seed, num_episodes, interval_s

    def run(self) -> None:
        env = envs.make_env(
            self._spec.env_id, self._num_episodes, seed=self._seed, evaluation=True, num_threads=1
        )
        try:
            self._evaluate_until_stopped(env)
        finally:
            env.close()
            self._finished.set()

    def _evaluate_until_stopped(self, env: Any) -> None:
        policy = self._builder.make_policy(self._spec, 0, 1, evaluation=True)
        key = jax.random.fold_in(jax.random.PRNGKey(self._seed), 2**20)
        evaluated = None  # the version evaluated last
        while not self.sleep(self._interval_s):
            # Version 0 is the initial, untrained network: not worth a periodic look.
            version = self._evaluate_newer(env, policy, key, 0 if evaluated is None else evaluated)
            evaluated = evaluated if version is None else version
        if self._final_evaluation:
            self._evaluate_newer(env, policy, key, -1 if evaluated is None else evaluated)

    def _evaluate_newer(
        self, env: Any, policy: builder_lib.Policy, key: jax.Array, newer_than: int
    ) -> int | None:
        """Evaluates the parameters if newer than `newer_than`; returns their version, or None."""
        answer = self._learner.get_params(newer_than)
        if answer is None:
            return None
        version, params = answer
        returns = run_episodes(env, policy, jax.device_put(params), key)
        self._monitor.report_eval(returns.tolist(), version)
        return version
