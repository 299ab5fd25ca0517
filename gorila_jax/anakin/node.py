"""The Anakin learner: a learner node whose batches are its own envs' steps, acted, stepped
and learned from in one compiled program on its devices (`loop.make_call`).

It is a synchronous learner in everything else (state, numeric guard and rollbacks,
published parameters, checkpoints, heartbeats), so the monitor, driver, evaluator,
summary, TensorBoard and `--resume` treat it as they treat a learner; it reports its
env steps, episodes and their returns as an actor does.
"""

import dataclasses
from typing import Any

import jax
import numpy as np

from gorila_jax import builder as builder_lib
from gorila_jax import gymnax_envs, parallel, replay, types
from gorila_jax.anakin import loop
from gorila_jax.distributed import program
from gorila_jax.learning import settings as learner_settings
from gorila_jax.learning import sync_learner


@dataclasses.dataclass(frozen=True)
class AnakinSettings:
    """How an Anakin learner acts.

    Attributes:
      num_actors: the actors whose envs it holds (each with its own policy index).
      num_envs_per_actor: envs per actor.
      iterations_per_call: rollout-and-update iterations in one device call.
      max_env_steps: it stops acting at this many env steps (the run's budget); it ends
        less than one iteration (every env's T steps) past it.
    """

    num_actors: int
    num_envs_per_actor: int
    iterations_per_call: int
    max_env_steps: int


def check_run(
    builder: builder_lib.AgentBuilder, spec: types.EnvSpec, settings: AnakinSettings, devices: int
) -> loop.Layout:
    """The layout of an Anakin run of `builder` on `spec` over `devices` devices.

    Raises:
      ValueError: in one line, naming what would work: an env that is not written in JAX,
        an agent whose replay is not a queue, or envs that do not match the agent's batch
        or do not split over the devices.
    """
    if not gymnax_envs.owns(spec.env_id):
        twin = gymnax_envs.PREFIX + spec.env_id
        hint = f" (try --env={twin})" if twin in gymnax_envs.known_env_ids() else ""
        raise ValueError(
            f"--launcher=anakin steps the envs inside the learner's compiled program, so it "
            f"needs an env written in JAX, gymnax/<id>{hint}; {spec.env_id} runs on CPU "
            "actors: use --launcher=local or ray for it"
        )
    layout = builder.replay_layout(spec)
    table = next(t for t in layout.tables if t.name == layout.sample_table)
    if table.kind != replay.QUEUE:
        raise ValueError(
            "--launcher=anakin runs on-policy agents (a trajectory queue: --agent=ppo) so far; "
            f"this agent samples a {table.kind} replay, and a replay on the device is not "
            "built yet: use --launcher=local or ray for it"
        )
    envs = settings.num_actors * settings.num_envs_per_actor
    batch = builder.batch_plan.batch_size
    if envs != batch:
        fix = (
            f"set --num_envs_per_actor={batch // settings.num_actors}"
            if batch % settings.num_actors == 0
            else f"set --num_actors to a divisor of {batch}"
        )
        raise ValueError(
            f"--launcher=anakin trains on each rollout once, one chunk per env: the agent's "
            f"batch of {batch} chunks needs num_actors x num_envs_per_actor = {batch} envs, "
            f"got {settings.num_actors} x {settings.num_envs_per_actor}; {fix}"
        )
    if settings.num_actors % devices:
        raise ValueError(
            f"--launcher=anakin gives each of the {devices} devices the envs of whole actors: "
            f"num_actors={settings.num_actors} must be a multiple of it "
            "(or set --num_learner_devices)"
        )
    return loop.Layout(
        devices, settings.num_actors // devices, settings.num_envs_per_actor, _chunk_length(layout)
    )


def _chunk_length(layout: builder_lib.ReplayLayout) -> int:
    """T of the agent's queue items (`types.Trajectory` of T steps), read off its codec."""
    item = layout.codec.decode(np.zeros((1, layout.codec.num_bytes), np.uint8))
    if not isinstance(item, types.Trajectory):
        raise ValueError(
            "--launcher=anakin makes trajectory chunks (types.Trajectory); this agent's queue "
            f"holds {type(item).__name__} items"
        )
    return int(item.reward.shape[1])


class AnakinNode(sync_learner.SyncLearnerNode):
    """Acts in its own envs and learns from them, one compiled call at a time.

    Args:
      builder, spec, monitor, seed, settings, checkpoint_dir, restore_step, name: as
        `learner.LearnerNode`'s.
      anakin: its envs, iterations per call and budget (`AnakinSettings`).
      restored_counters: the counters it reported last (a restart, or the checkpoint's
        on a resume): learner steps, env steps and episodes go on from them. Its envs
        start new episodes (an env's state is not checkpointed).
    """

    def __init__(
        self,
        builder: builder_lib.AgentBuilder,
        spec: types.EnvSpec,
        monitor: program.Client | None,
        seed: int,
        settings: learner_settings.LearnerSettings,
        anakin: AnakinSettings,
        checkpoint_dir: str | None = None,
        restore_step: int | None = None,
        restored_counters: dict[str, float] | None = None,
        name: str = "learner/0",
    ):
        super().__init__(
            builder,
            spec,
            None,
            monitor,
            seed,
            settings,
            checkpoint_dir,
            restore_step,
            restored_counters,
            name,
        )
        self._anakin = anakin
        layout = check_run(builder, spec, anakin, len(self._devices))
        self._env_steps_per_iteration = layout.env_steps_per_iteration
        counters = restored_counters or {}
        self._env_steps = int(counters.get("env_steps", 0))
        self._episodes = int(counters.get("episodes", 0))
        self._returns: list[float] = []
        self._call = parallel.pmap_step(
            loop.make_call(builder, spec, layout, anakin.num_actors, anakin.iterations_per_call),
            self._devices,
            out_axes=loop.OUT_AXES,
            in_axes=loop.IN_AXES,
        )
        reset = parallel.pmap_step(loop.make_reset(spec.env_id, layout), self._devices)
        keys = loop.env_keys(seed, self._env_steps, len(self._devices))
        self._envs = reset(parallel.per_device(keys, self._devices))

    def _iterations_left(self) -> int:
        """Iterations until the budget is spent (the last may pass it)."""
        left = self._anakin.max_env_steps - self._env_steps
        return max(0, -(-left // self._env_steps_per_iteration))

    def step(self, timeout: float = 1.0) -> bool:
        """One device call: up to `iterations_per_call` rollouts, each followed by an update.
        Returns False once the budget is spent (after a pause of `timeout` at most)."""
        active = min(self._anakin.iterations_per_call, self._iterations_left())
        if active == 0:
            self.sleep(min(timeout, 0.05))  # the driver ends the run
            return False
        with self._state_lock:
            carry, out = self._call((self._state, self._guard, self._envs), self._steps, active)
            self._state, self._guard, self._envs = carry
            with self._params_lock:
                self._steps += active
                self._published = out.published
        finished, env_steps = jax.device_get((out.finished_returns, out.env_steps))
        returns = finished[~np.isnan(finished)].tolist()
        self._returns.extend(returns)
        self._episodes += len(returns)
        self._env_steps += int(env_steps.sum())
        self._last_batch_size = self._builder.batch_plan.batch_size
        streak = self._finish_step(None, out.info)
        if self._settings.max_nonfinite_steps and streak >= self._settings.max_nonfinite_steps:
            self._roll_back(streak)
        return True

    def _take_episode_returns(self) -> list[float]:
        returns, self._returns = self._returns, []
        return returns

    def _heartbeat_counters(self) -> dict[str, int]:
        return {
            **super()._heartbeat_counters(),
            "env_steps": self._env_steps,
            "episodes": self._episodes,
        }

    def _checkpoint_contents(self) -> tuple[int, Any, dict[str, Any]]:
        step, state, node_meta = super()._checkpoint_contents()
        node_meta["counters"].update(env_steps=self._env_steps, episodes=self._episodes)
        return step, state, node_meta
