"""Greedy evaluation: full episodes with the evaluation policy, and the evaluator node."""

from typing import Any

import jax
import numpy as np

from gorila_jax import builder as builder_lib
from gorila_jax import envs, parameter_server, program, types


def run_episodes(env: Any, policy: builder_lib.Policy, params: Any, key: jax.Array) -> np.ndarray:
    """Plays one episode in each of `env`'s envs; returns their undiscounted returns [E]."""
    obs, _ = env.reset()
    num_envs = obs.shape[0]
    returns = np.zeros(num_envs, np.float64)
    done = np.zeros(num_envs, bool)
    step = 0
    while not done.all():
        action, _ = builder_lib.split_policy_output(policy(params, obs, key, step))
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


class EvaluatorNode(program.Worker):
    """Every `interval_s`, evaluates the learner's newest parameters and reports the mean."""

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
        policy = self._builder.make_policy(self._spec, 0, 1, evaluation=True)
        key = jax.random.fold_in(jax.random.PRNGKey(self._seed), 2**20)
        version = 0  # version 0 is the initial, untrained network: not worth a look
        try:
            while not self.sleep(self._interval_s):
                answer = self._learner.get_params(version)
                if answer is None:
                    continue
                version, params = answer
                returns = run_episodes(env, policy, jax.device_put(params), key)
                self._monitor.report_eval(returns.tolist(), version)
        finally:
            env.close()
