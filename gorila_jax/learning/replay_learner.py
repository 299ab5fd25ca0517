"""The base of every node that learns from replay: the synchronous learner and Gorila workers."""

import contextlib
import threading
from typing import Any, Callable, ContextManager

import numpy as np

from gorila_jax import builder as builder_lib
from gorila_jax import replay, types
from gorila_jax.distributed import program
from gorila_jax.health import balance
from gorila_jax.health import monitor as monitor_lib
from gorila_jax.learning import checkpoint, prefetch
from gorila_jax.learning import settings as learner_settings


class ReplayLearnerNode(program.Worker):
    """Samples replay onto local devices, sends priorities, runs the loop, checkpoints.

    What the synchronous learner and the Gorila gradient workers share: a
    `prefetch.DevicePrefetcher` across every replay shard, started by the
    first `step`; new priorities sent from a thread of their own; rows trained
    on counted per source actor (`balance.SampledRows`, which also weights the
    priorities for data balance); the `run` loop beside a heartbeat, ending
    with sampling joined, a blocking report and a final checkpoint; and the
    replay checkpointed before the node's state (`save_checkpoint`).

    A subclass gives `step` (with `_next_batch` and `_account`), the rows to
    sample, its counters, reports and what a checkpoint holds.

    Args:
      builder: the agent.
      spec: the environment's spec.
      replay_client: the replay node, or a list of the replay shards' nodes; None for a
        node that makes its batches itself (an Anakin learner's rollouts).
      monitor: the monitor node (or None when driven by hand).
      name: the node's name, as the monitor knows it.
      devices: the local devices batches go to.
      settings: the node's settings (its report interval and checkpoints to keep here;
        the rest is the subclass's).
      checkpoint_dir: the node's checkpoint directory (absolute); None: no checkpoints.
      restored_counters: the counters this node reported last (a restart or a
        resume continues its rows per actor).
    """

    def __init__(
        self,
        builder: builder_lib.AgentBuilder,
        spec: types.EnvSpec,
        replay_client: program.Client | list[program.Client],
        monitor: program.Client | None,
        name: str,
        devices: list,
        settings: learner_settings.LearnerSettings,
        checkpoint_dir: str | None,
        restored_counters: dict[str, float] | None,
    ):
        super().__init__()
        self._builder, self._monitor, self._name = builder, monitor, name
        self._devices, self._settings = devices, settings
        self._replay = None if replay_client is None else replay.ReplayShards(replay_client)
        layout = builder.replay_layout(spec)
        self._codec, self._sample_table = layout.codec, layout.sample_table
        self._checkpoints: checkpoint.LearnerCheckpoints | None = None
        if checkpoint_dir is not None:
            self._checkpoints = checkpoint.LearnerCheckpoints(
                checkpoint_dir, settings.max_checkpoints_to_keep
            )
        self._last_checkpoint_step = 0
        self._sampled = balance.SampledRows(restored_counters)
        self._duplicates = builder_lib.duplicate_counter(builder)
        self._prefetcher: prefetch.DevicePrefetcher | None = None
        self._tiers: replay.TierMetrics | None = None  # a tiered replay's metrics
        self._priorities: replay.PriorityUpdater | None = None
        # Held while sampling starts or ends: `close` (the launcher's thread) then waits
        # for an end that `run` (the node's thread) began, instead of returning while
        # its sampling threads still talk to a replay about to stop.
        self._sampling_lock = threading.Lock()
        self._sampling_closed = False  # set by `close`: no step starts sampling again
        self._run_error: BaseException | None = None

    # ------------------------------------------------------------ what a subclass gives

    def step(self, timeout: float = 1.0) -> bool:
        """One update (or gradient); False if no batch came within `timeout`."""
        raise NotImplementedError

    def _rows_to_sample(self) -> int:
        """The batch this node samples next (its share of a global batch)."""
        raise NotImplementedError

    def _between_steps(self) -> None:
        """Periodic work of the run loop after each step: reports, checkpoints."""

    def _heartbeat_counters(self) -> dict[str, int]:
        raise NotImplementedError

    def _heartbeat_metrics(self) -> Callable[[dict[str, int]], dict[str, float]] | None:
        """What each heartbeat carries beside the counters (`monitor.Heartbeat`); None: nothing."""
        return None

    def _report(self, block: bool = False) -> None:
        raise NotImplementedError

    def _checkpoint_contents(self) -> tuple[int, Any, dict[str, Any]]:
        """(step, state to save, metadata beside the monitor's), read under `_checkpoint_lock`.

        The metadata's "counters" are this node's; its "beside", if any, goes into files of
        its own in the checkpoint (`LearnerCheckpoints.save`)."""
        raise NotImplementedError

    def _checkpoint_lock(self) -> ContextManager:
        """Held while a checkpoint reads the state and writes the replay."""
        return contextlib.nullcontext()

    def _done(self) -> bool:
        return self.stopping

    # ------------------------------------------------------------ sampling

    def _start_sampling(self) -> None:
        make_batches = prefetch.sampler(
            self._replay,
            self._sample_table,
            self._codec,
            self._stop_event,
            content_hashes=self._duplicates is not None,
            demo_fraction=builder_lib.demo_fraction(self._builder) or 0.0,
        )
        self._prefetcher = prefetch.DevicePrefetcher(
            make_batches, self._rows_to_sample, self._devices, self._stop_event
        )
        self._priorities = self._replay.priority_updater(self._sample_table)
        tiered = self._replay.cold_tiers(self._sample_table)
        if tiered and self._tiers is None:
            self._tiers = replay.TierMetrics(self._replay.nodes, list(tiered))

    def _next_batch(self, timeout: float) -> tuple[np.ndarray, Any] | None:
        """The next (keys, device batch), sampling from the first call on; None after `timeout`."""
        with self._sampling_lock:
            if self._prefetcher is None:
                if self._sampling_closed:
                    return None
                self._start_sampling()
            prefetcher = self._prefetcher
        return prefetcher.get(timeout)

    def _account(self, keys: np.ndarray | None, priorities: Any) -> None:
        """Counts the rows as trained on and sends their new priorities (None: none to send).

        The updater thread waits for the device; the caller goes on dispatching.
        `keys` None: a batch handed in by hand, with no items behind it.
        """
        if keys is None:
            return
        scale = self._sampled.count(keys)
        if self._tiers is not None:
            self._tiers.count(getattr(keys, "shards", None))
        bonus = None
        if self._duplicates is not None:
            bonus = self._duplicates.bonus(keys.hashes, keys.sources)
        updater = self._priorities  # `_end_sampling` may clear it meanwhile
        if priorities is not None and updater is not None:
            updater.submit(keys, priorities, scale, bonus)

    def _end_sampling(self) -> None:
        """`prefetch.end_sampling` of this node's; a later `step` starts sampling again.
        Safe to call more than once, from any thread: a call returns once sampling has ended."""
        with self._sampling_lock:
            prefetcher, priorities = self._prefetcher, self._priorities
            self._prefetcher = self._priorities = None
            prefetch.end_sampling(prefetcher, priorities)

    def _replay_metrics(self) -> dict[str, float]:
        """A tiered replay's items, bytes and reads per tier, and this node's rows from each."""
        return {} if self._tiers is None else self._tiers.metrics()

    def set_sample_weights(self, weights: dict[int, float]) -> None:
        """Data balance ("downweight"): new priorities of actor i's items are multiplied by
        weights[i] from the next update on (`balance.SampledRows.set_weights`)."""
        self._sampled.set_weights(weights)

    # ------------------------------------------------------------ lifecycle

    def run(self) -> None:
        # Beats while the first step compiles and while replay is below its minimum.
        heartbeat = monitor_lib.Heartbeat(
            self._monitor,
            self._name,
            self._heartbeat_counters,
            self._settings.heartbeat_interval_s,
            metrics=self._heartbeat_metrics(),
        ).start()
        try:
            self._run()
        except BaseException as error:
            self._run_error = error
            raise
        finally:
            self._end_sampling()  # after a failure too: no sampling thread outlives `run`
            heartbeat.stop()
            self._finished.set()

    def _run(self) -> None:
        while not self._done():
            self.step()
            self._between_steps()
        # Sampling and priority updates end here, while the replay still
        # serves: the final checkpoint holds every priority sent, and no
        # thread of this node talks to Reverb once `wait_finished` says done.
        self._end_sampling()
        self._report(block=True)  # the driver's summary and the final checkpoint read it
        if self._checkpoints is not None:
            self.save_checkpoint()

    def wait_finished(self, timeout: float) -> bool:
        """Blocks until `run` has returned (after its final checkpoint), or timeout.

        Raises:
          RuntimeError: if `run` failed (the final checkpoint, for example).
        """
        finished = super().wait_finished(timeout)
        if self._run_error is not None:
            raise RuntimeError(f"{self._name} failed: {self._run_error!r}") from self._run_error
        return finished

    def save_checkpoint(self) -> int:
        """Checkpoints the replay, then this node's state, at its current step.

        The replay goes first and deletes its old checkpoints last: a learner
        checkpoint on disk always has its replay checkpoint beside it, even
        after a crash at any point (see `gorila_jax.learning.checkpoint`).
        Counters, recent returns and evaluations come from the monitor; a
        periodic checkpoint sees them up to one report interval late. A node without a
        replay saves its state alone.

        Returns:
          The step saved.
        """
        if self._checkpoints is None:
            raise RuntimeError(f"{self._name} was built without a checkpoint_dir")
        with self._checkpoint_lock():
            step, state, node_meta = self._checkpoint_contents()
            if self._replay is not None:
                node_meta["replay"] = self._replay.checkpoint(step)
            counters = node_meta.pop("counters")
            beside = node_meta.pop("beside", None)
            meta = checkpoint.run_meta(self._monitor, self._name, counters, step, **node_meta)
            self._checkpoints.save(step, state, meta, beside)  # deletes its old ones here
        # Only now, with the new pair complete, may the replay drop the old ones.
        if self._replay is not None:
            self._replay.keep_checkpoints(self._checkpoints.steps())
        self._last_checkpoint_step = step
        return step

    def close(self) -> None:
        """Ends sampling and priority updates (if `run` has not).

        Before the replay's servers stop: the launchers close a node before
        the nodes whose handles it holds.
        """
        with self._sampling_lock:
            self._sampling_closed = True
        self._end_sampling()
