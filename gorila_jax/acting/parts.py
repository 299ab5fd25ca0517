"""What every acting loop uses (actors, evaluators, recorders): a fresh key per step,
an actor's seeds, the returns of finished episodes, a parameter copy that is refreshed
without blocking, and an env seen as a task of roles (`task_env`)."""

import concurrent.futures
import itertools
from typing import Any, Iterator

import jax
import numpy as np

from gorila_jax import envs, multiagent
from gorila_jax.distributed import program
from gorila_jax.gorila import parameter_server


KEY_BLOCK = 1024  # step keys split at once


def step_keys(key: jax.Array) -> Iterator[np.ndarray]:
    """Yields the fresh key a caller hands its policy at each step; the same `key`, the same keys.

    Step s gets key s % KEY_BLOCK of `split(fold_in(key, s // KEY_BLOCK), KEY_BLOCK)`.
    The keys are split a block at a time into host memory because a `fold_in`
    per step is a device call: it doubled the step of CartPole's DQN policy.
    """
    for block in itertools.count():
        yield from np.asarray(jax.random.split(jax.random.fold_in(key, block), KEY_BLOCK))


def actor_seeds(seed: int, actor_index: int, env_steps: int) -> tuple[int, jax.Array]:
    """(env seed, policy key) of actor `actor_index` that has acted `env_steps` before.

    Keys fold in the index, so adding actors never changes the streams of existing
    ones; a resumed actor (env_steps > 0) must not replay its predecessor's
    episodes, nor its actions, so they fold in its env steps too.
    """
    key = jax.random.fold_in(jax.random.PRNGKey(seed), 1 + actor_index)
    if env_steps:
        key = jax.random.fold_in(key, env_steps)
    env_key, policy_key = jax.random.split(key)
    return int(jax.random.randint(env_key, (), 0, 2**31 - 1)), policy_key


class EpisodeTracker:
    """Running returns and lengths of E envs; collects those of finished episodes."""

    def __init__(self, num_envs: int, episodes: int = 0):
        self._returns = np.zeros(num_envs, np.float64)
        self._lengths = np.zeros(num_envs, np.int64)
        self.finished_returns: list[float] = []
        self.episodes = episodes

    def update(self, reward, ended, valid) -> None:
        self._returns += np.where(valid, reward, 0.0)
        self._lengths += valid
        if ended.any():
            self.finished_returns.extend(self._returns[ended].tolist())
            self.episodes += int(ended.sum())
            self._returns[ended] = 0.0
            self._lengths[ended] = 0

    def take_returns(self) -> list[float]:
        returns, self.finished_returns = self.finished_returns, []
        return returns


class ParameterPuller:
    """The actor's local parameter copy, refreshed from the learner without blocking.

    The first parameters are fetched synchronously (nothing to act with
    before). After that, every `interval` calls a request goes out as a
    future; acting goes on with the current copy until the answer arrives.
    The learner answers None when it has nothing newer than our version.
    """

    def __init__(self, learner: program.Client, interval: int):
        self._learner, self._interval = learner, interval
        self.version, params = learner.get_params()
        self._params = jax.device_put(params)
        self._pending: concurrent.futures.Future | None = None
        self._calls = 0

    def next_params(self) -> Any:
        if self._pending is None and self._calls % self._interval == 0:
            self._pending = self._learner.futures.get_params(self.version)
        if self._pending is not None and self._pending.done():
            answer, self._pending = self._pending.result(), None
            if answer is not None:
                self.version, params = answer
                self._params = jax.device_put(params)
        self._calls += 1
        return self._params

    def close(self) -> None:
        """Waits for the request in flight, so that no thread of the actor outlives its `run`."""
        pending, self._pending = self._pending, None
        if pending is not None:
            concurrent.futures.wait([pending], timeout=60.0)
        parameter_server.close_source(self._learner)


class OneRole:
    """A vector env as a task of one role, `None`, the way acting and evaluation loops
    step every task: role -> arrays. `send`/`recv` and `step` give role -> (observations,
    rewards, terminated, truncated, info)."""

    def __init__(self, env: Any):
        self.env = env

    def reset(self) -> dict[None, np.ndarray]:
        obs, _ = self.env.reset()
        return {None: obs}

    def send(self, actions: dict[None, np.ndarray]) -> None:
        self.env.send(actions[None])

    def recv(self) -> dict[None, tuple]:
        return {None: self.env.recv()}

    def step(self, actions: dict[None, np.ndarray]) -> dict[None, tuple]:
        return {None: self.env.step(actions[None])}

    def close(self) -> None:
        self.env.close()


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


def task_env(
    env_id: str,
    num_envs: int,
    seed: int,
    evaluation: bool = False,
    num_threads: int | None = None,
) -> OneRole | Roles:
    """`num_envs` copies of `env_id` as every acting and evaluation loop steps them, role
    -> arrays: a task of several roles (`multiagent.roles_of`) as `Roles`, any other env
    as `OneRole` (`envs.make_env`, with its `evaluation` preprocessing and, if given,
    `num_threads`; the settings refuse a thread pool for a task of several roles)."""
    if multiagent.roles_of(env_id):
        return Roles(multiagent.MultiAgentVectorEnv(env_id, num_envs, seed))
    threads = {} if num_threads is None else {"num_threads": num_threads}
    return OneRole(envs.make_env(env_id, num_envs, seed=seed, evaluation=evaluation, **threads))
