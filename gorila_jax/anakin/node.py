"""The Anakin learner: a learner node that acts in its own envs, steps them, keeps their
transitions (an off-policy agent's device replay) and learns from them in one compiled
program on its devices (`loop.make_call`).

It is a synchronous learner in everything else (state, numeric guard and rollbacks,
published parameters, checkpoints, heartbeats), so the monitor, driver, evaluator,
summary, TensorBoard and `--resume` treat it as they treat a learner; it reports its
env steps, episodes and their returns as an actor does.
"""

import dataclasses
import logging
import math
import time
from typing import Any

import jax
import numpy as np

from gorila_jax import builder as builder_lib
from gorila_jax import gymnax_envs, parallel, replay, types
from gorila_jax.anakin import loop
from gorila_jax.distributed import program
from gorila_jax.learning import settings as learner_settings
from gorila_jax.learning import step as step_lib
from gorila_jax.learning import sync_learner


# The checkpoint file beside the agent's state that keeps an off-policy agent's device
# replay, its envs' last steps, its owed updates and its sampling key.
DEVICE_REPLAY = "device_replay"
# The metric of the compiled loop's env steps per second (`AnakinNode._with_loop_rate`).
LOOP_RATE = "loop_env_steps_per_s"


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
        actors that do not split over the devices, a queue agent's envs that do not match
        its batch, or an off-policy agent the loop cannot pace (a growing batch, no
        samples_per_insert, duplicate-aware priorities).
    """
    if not gymnax_envs.owns(spec.env_id):
        twin = gymnax_envs.PREFIX + spec.env_id
        hint = f" (try --env={twin})" if twin in gymnax_envs.known_env_ids() else ""
        raise ValueError(
            f"--launcher=anakin steps the envs inside the learner's compiled program, so it "
            f"needs an env written in JAX, gymnax/<id>{hint}; {spec.env_id} runs on CPU "
            "actors: use --launcher=local or ray for it"
        )
    if settings.num_actors % devices:
        raise ValueError(
            f"--launcher=anakin gives each of the {devices} devices the envs of whole actors: "
            f"num_actors={settings.num_actors} must be a multiple of it "
            "(or set --num_learner_devices)"
        )
    table = builder.replay_layout(spec).sampled
    plan = builder.batch_plan
    refusal = None
    if table.kind == replay.QUEUE:
        envs = settings.num_actors * settings.num_envs_per_actor
        if envs != plan.batch_size:
            fix = (
                f"set --num_envs_per_actor={plan.batch_size // settings.num_actors}"
                if plan.batch_size % settings.num_actors == 0
                else f"set --num_actors to a divisor of {plan.batch_size}"
            )
            raise ValueError(
                f"--launcher=anakin trains on each rollout once, one chunk per env: the "
                f"agent's batch of {plan.batch_size} chunks needs num_actors x "
                f"num_envs_per_actor = {plan.batch_size} envs, got {settings.num_actors} x "
                f"{settings.num_envs_per_actor}; {fix}"
            )
    elif builder_lib.n_step(builder) is None:
        refusal = "this agent's replay items are not n-step transitions"
    elif len(plan.schedule) > 1:
        refusal = (
            f"its batch grows ({plan.batch_size} to {plan.largest_batch}), and one compiled "
            "loop takes one batch size: keep it fixed"
        )
    elif table.rate_limit.samples_per_insert is None:
        refusal = "its replay sets no samples_per_insert, which paces the updates here"
    elif builder_lib.duplicate_counter(builder) is not None:
        refusal = "duplicate-aware priorities count several actors' copies of one transition"
    if refusal:
        raise ValueError(f"--launcher=anakin cannot run this agent: {refusal}")
    # Computing it refuses a queue whose items are not trajectory chunks.
    return layout_of(builder, spec, settings, devices)


def layout_of(
    builder: builder_lib.AgentBuilder, spec: types.EnvSpec, settings: AnakinSettings, devices: int
) -> loop.Layout:
    """The layout of a run `check_run` accepted (the node's, which the mode checked)."""
    layout = builder.replay_layout(spec)
    per_device = settings.num_actors // devices
    if layout.sampled.kind == replay.QUEUE:
        return loop.Layout(devices, per_device, settings.num_envs_per_actor, _chunk_length(layout))
    envs = settings.num_actors * settings.num_envs_per_actor
    # Long enough that an iteration's inserts owe at least one update.
    updates_per_item = layout.sampled.rate_limit.samples_per_insert / builder.batch_plan.batch_size
    length = max(builder_lib.n_step(builder).n, math.ceil(1 / (updates_per_item * envs)))
    return loop.Layout(devices, per_device, settings.num_envs_per_actor, length)


def learning(
    builder: builder_lib.AgentBuilder, spec: types.EnvSpec, layout: loop.Layout
) -> loop.Learning:
    """How each iteration learns: from the rollout itself (a queue's agent), or from the
    device replay its transitions go into."""
    update = step_lib.make_step(builder, spec, from_replay=False)
    table = builder.replay_layout(spec).sampled
    if table.kind == replay.QUEUE:
        return loop.on_policy(update, layout)
    return loop.off_policy(
        update, layout, spec, builder_lib.n_step(builder), table, builder.batch_plan.batch_size
    )


def device_program(
    builder: builder_lib.AgentBuilder,
    spec: types.EnvSpec,
    layout: loop.Layout,
    learns: loop.Learning,
    iterations: int,
    devices: list[jax.Device],
    seed: int,
    env_steps: int,
) -> tuple[Any, Any, Any]:
    """(the compiled device call, the devices' fresh envs, what each keeps between
    iterations at the start), as the node runs them; `env_steps` so far draws the envs' keys."""
    num_actors = layout.num_devices * layout.actors_per_device
    call = parallel.pmap_step(
        loop.make_call(builder, spec, layout, num_actors, iterations, learns),
        devices,
        out_axes=loop.OUT_AXES,
        in_axes=loop.IN_AXES,
    )
    keys = parallel.per_device(loop.env_keys(seed, env_steps, len(devices)), devices)
    envs = parallel.pmap_step(loop.make_reset(spec.env_id, layout), devices, donate_state=False)(
        keys
    )
    kept = parallel.pmap_step(
        lambda key: learns.initial(jax.random.fold_in(key, 1)), devices, donate_state=False
    )(keys)
    return call, envs, kept


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
      builder, spec, monitor, seed, settings, name: as `learner.LearnerNode`'s.
      anakin: its envs, iterations per call and budget (`AnakinSettings`).
      start: as `learner.LearnerNode`'s; learner steps, env steps and episodes go on from
        its `restored_counters` (a restart, or the checkpoint's on a resume), an off-policy
        agent's device replay from the checkpoint it restores. Its envs start new episodes
        (an env's state is not checkpointed).
    """

    def __init__(
        self,
        builder: builder_lib.AgentBuilder,
        spec: types.EnvSpec,
        monitor: program.Client | None,
        seed: int,
        settings: learner_settings.LearnerSettings,
        anakin: AnakinSettings,
        start: sync_learner.LearnerStart = sync_learner.FRESH,
        name: str = "learner/0",
    ):
        super().__init__(builder, spec, None, monitor, seed, settings, start, name)
        self._anakin = anakin
        layout = layout_of(builder, spec, anakin, len(self._devices))
        self._env_steps_per_iteration = layout.env_steps_per_iteration
        counters = start.restored_counters or {}
        self._env_steps = int(counters.get("env_steps", 0))
        self._episodes = int(counters.get("episodes", 0))
        self._returns: list[float] = []
        # The compiled loop's clock: from the end of the first device call (which compiles)
        # to the end of the latest, and the env steps of the calls in between.
        self._first_call_end: float | None = None
        self._loop_s = 0.0
        self._loop_env_steps = 0
        self._call, self._envs, self._kept = device_program(
            builder,
            spec,
            layout,
            learning(builder, spec, layout),
            anakin.iterations_per_call,
            self._devices,
            seed,
            self._env_steps,
        )
        if self._started_from >= 0:
            self._restore_kept(self._started_from)

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
            carry = (self._state, self._guard, self._envs, self._kept)
            carry, out = self._call(carry, self._steps, active)
            self._state, self._guard, self._envs, self._kept = carry
            # Every device makes the same updates: the first one's count.
            finished, env_steps, updates = jax.device_get(
                (out.finished_returns, out.env_steps, out.updates[0])
            )
            self._time_call(int(env_steps.sum()))
            with self._params_lock:
                self._steps += int(updates.sum())
                self._published = out.published
        returns = finished[~np.isnan(finished)].tolist()
        self._returns.extend(returns)
        self._episodes += len(returns)
        self._env_steps += int(env_steps.sum())
        if not updates.any():
            return True  # the replay is still filling
        self._last_batch_size = self._builder.batch_plan.batch_size
        streak = self._finish_step(None, self._with_loop_rate(out.info))
        if self._settings.max_nonfinite_steps and streak >= self._settings.max_nonfinite_steps:
            self._roll_back(streak)
        return True

    def _time_call(self, env_steps: int) -> None:
        now = time.perf_counter()
        if self._first_call_end is None:
            self._first_call_end = now
            return
        self._loop_s = now - self._first_call_end
        self._loop_env_steps += env_steps

    def _with_loop_rate(self, info: builder_lib.StepInfo) -> builder_lib.StepInfo:
        """The step's metrics and `loop_env_steps_per_s`: this node's env steps per second
        since its first device call (its compilation) ended, NaN until a second one has;
        the training rate alone, where the run's env steps/s counts its start, compilation
        and final evaluation too. The host's work between calls is in it."""
        rate = self._loop_env_steps / self._loop_s if self._loop_s > 0 else math.nan
        devices = len(self._devices)
        return info._replace(metrics={**info.metrics, LOOP_RATE: np.full(devices, rate)})

    def _restore_kept(self, step: int) -> None:
        """An off-policy agent's device replay (and the steps it waits on) as checkpoint
        `step` kept them; an empty one, with a warning, where they do not load."""
        if not jax.tree.leaves(self._kept):
            return  # an on-policy agent keeps nothing between rollouts
        try:
            kept = self._checkpoints.restore_beside(step, DEVICE_REPLAY, jax.device_get(self._kept))
        except Exception:  # noqa: BLE001  a damaged file, or another number of devices
            logging.warning(
                "%s: the device replay of checkpoint %d does not load; it fills again",
                self._name,
                step,
                exc_info=True,
            )
            return
        self._kept = parallel.per_device(kept, self._devices)

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
        if jax.tree.leaves(self._kept):
            node_meta["beside"] = {DEVICE_REPLAY: jax.device_get(self._kept)}
        return step, state, node_meta
