"""The actor node: an envpool vector env, a jitted policy on a local parameter copy, an adder."""

import concurrent.futures
import itertools
import logging
import threading
import time
from typing import Any, Iterator

import jax
import numpy as np

from gorila_jax import builder as builder_lib
from gorila_jax import envs, replay, types
from gorila_jax.acting.settings import ActorSettings
from gorila_jax.distributed import program
from gorila_jax.gorila import parameter_server
from gorila_jax.health import monitor as monitor_lib


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


class LimitedActing(program.Worker):
    """An acting node whose env steps the driver can cap near the end of the run's budget
    (`gorila_jax/run/budget.py`): its loop calls `at_env_step_limit` before each step,
    and ends at its settings' `max_env_steps` (`budget_spent`)."""

    def __init__(self, settings: ActorSettings):
        super().__init__()
        self._settings = settings
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
        return 0 < self._settings.max_env_steps <= self.env_steps_now()

    def at_env_step_limit(self) -> bool:
        """Whether the node is at its limit (then after a short wait: call it again)."""
        if self._env_step_limit is None or self.env_steps_now() < self._env_step_limit:
            return False
        self.sleep(0.02)
        return True


class ActorNode(LimitedActing):
    """Acts in `num_envs` envpool envs and writes what it sees to replay.

    Parameters are pulled from the learner every `settings.param_pull_interval` actor
    steps (one step = one vectorized env step) as a future: acting goes on
    with the old parameters until the new ones arrive.

    Args:
      builder: the agent.
      spec: the environment's spec.
      actor_index: this actor's index; keys and env seeds derive from it.
      num_actors: how many actors the program has (for per-actor exploration).
      replay_client, learner, monitor: clients of those nodes (monitor may be None).
        `replay_client` may be the list of a sharded replay's shards: the actor
        writes to its assigned one, `replay.assigned_shard`.
      seed: root seed of the experiment.
      settings: how it acts (envs, pulls, heartbeats, threads; `ActorSettings`).
      restored_counters: this actor's counters when the run was checkpointed
        (see `counters`); env steps (the exploration schedule's position) and
        episodes continue from them.
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
        super().__init__(settings)
        self.name = f"actor/{actor_index}"
        self._actor_index = actor_index
        self._builder, self._spec = builder, spec
        self._learner = parameter_server.parameter_source(learner, builder, spec, seed, self.name)
        self._monitor = monitor
        self._rows = settings.num_envs * spec.agents_per_env  # the batch the policy and adder see
        restored_counters = restored_counters or {}
        self.env_steps = int(restored_counters.get("env_steps", 0))
        self._env_seed, self._policy_key = actor_seeds(seed, actor_index, self.env_steps)
        self._policy = builder.make_policy(spec, actor_index, num_actors, evaluation=False)
        replay_client = replay.actor_shard(replay_client, actor_index)
        self._replay_node = replay_client
        self._replay_endpoint = replay_client.endpoint()
        self.param_version = -1
        self.episodes = EpisodeTracker(self._rows, int(restored_counters.get("episodes", 0)))

    def run(self) -> None:
        # Beats from its own thread: a hung env shows as a stall, not a death.
        settings = self._settings
        heartbeat = monitor_lib.Heartbeat(
            self._monitor, self.name, self.counters, settings.heartbeat_interval_s
        ).start()
        env = adder = puller = None
        try:
            env = envs.make_env(
                self._spec.env_id,
                settings.num_envs,
                seed=self._env_seed,
                num_threads=settings.env_threads,
            )
            connection = replay.connect(self._replay_node, self._replay_endpoint)
            layout = self._builder.replay_layout(self._spec)
            adder = layout.make_adder(connection, self._rows, self._stop_event)
            puller = ParameterPuller(self._learner, settings.param_pull_interval)
            self._act(env, adder, puller)
        except replay.Stopped:
            pass  # the rate limiter held our inserts while we were asked to stop
        finally:
            # Everything this node started ends here, before `wait_finished`
            # says done and the driver goes on to stop the replay: the
            # writer's items are confirmed while the server still serves.
            try:
                heartbeat.stop()
                for part in (adder, env, puller):
                    if part is not None:
                        part.close()
                self._final_report()
            finally:
                self._finished.set()

    def _act(self, env: Any, adder: Any, puller: "ParameterPuller") -> None:
        """Steps the envs, writing every step to replay, until stopped or out of budget."""
        obs, _ = env.reset()
        valid = np.ones(self._rows, bool)
        unwritten: types.EnvStep | None = None
        last_report = time.monotonic()
        # One key per step of this loop, not per env step: a step in which every env
        # resets adds no env step, and would repeat its predecessor's key. A resumed
        # actor counts from 0 again, from a key of its own (see `__init__`).
        keys = step_keys(self._policy_key)
        while not self.stopping and not self.budget_spent():
            if self.at_env_step_limit():
                continue
            params, version = puller.next_params(), puller.version
            action, extras = builder_lib.split_policy_output(
                self._policy(params, obs, next(keys), self.env_steps)
            )
            action = np.asarray(action)
            # envpool steps the envs in its own thread while this one writes the
            # previous step to replay: the two costs overlap instead of adding up.
            env.send(action)
            if unwritten is not None:
                adder.add(unwritten)
            extras = jax.tree.map(np.asarray, extras)  # None for policies without extras
            next_obs, reward, terminated, truncated, info = env.recv()
            unwritten = types.EnvStep(
                obs,
                action,
                reward,
                terminated,
                truncated,
                next_obs,
                valid,
                extras,
                version,
                self._actor_index,
            )
            ended = valid & (terminated | truncated)
            raw_reward, game_over = envs.game_signals(reward, terminated, truncated, info)
            self.episodes.update(raw_reward, valid & game_over, valid)
            self.env_steps += int(valid.sum())
            self.param_version = puller.version
            valid, obs = ~ended, next_obs
            if time.monotonic() - last_report >= self._settings.heartbeat_interval_s:
                self._report()
                last_report = time.monotonic()
        if unwritten is not None and not self.stopping:
            adder.add(unwritten)

    def env_steps_now(self) -> int:
        return self.env_steps

    def counters(self) -> dict[str, int]:
        """Env steps, finished episodes and the parameter version acted with."""
        return {
            "env_steps": self.env_steps,
            "episodes": self.episodes.episodes,
            "param_version": self.param_version,
        }

    def _report(self) -> None:
        if self._monitor is not None:
            self._monitor.futures.report(
                self.name, self.counters(), episode_returns=self.episodes.take_returns()
            )

    def _final_report(self) -> None:
        # Blocking, unlike `_report`: the final checkpoint reads these counters
        # from the monitor once `wait_finished` says the actor is done.
        if self._monitor is None:
            return
        try:
            self._monitor.report(
                self.name, self.counters(), episode_returns=self.episodes.take_returns()
            )
        except Exception:  # noqa: BLE001  a monitor already gone only loses this report
            logging.exception("%s: final report to the monitor failed", self.name)
