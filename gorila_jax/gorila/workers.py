"""Gorila gradient workers: replay -> gradients on local parameters -> slices to the shards."""

import math
import threading
import time
from typing import Any

import jax
import numpy as np

from gorila_jax import builder as builder_lib
from gorila_jax import parallel, precision, replay, types
from gorila_jax.distributed import program
from gorila_jax.gorila import compression, parameter_server
from gorila_jax.health import balance
from gorila_jax.health import monitor as monitor_lib
from gorila_jax.learning import checkpoint, learner


class LossOutlierFilter:
    """Gorila's second rule: drop a gradient whose loss is far above this worker's norm.

    Keeps an exponential running mean and variance of the loss; a loss more
    than `num_stds` standard deviations above the mean is an outlier. The
    first `warmup` losses are never dropped (no statistics yet). Outliers do
    not enter the statistics, so one bad batch cannot widen the band.
    """

    def __init__(self, num_stds: float, decay: float = 0.99, warmup: int = 100):
        self._num_stds, self._decay, self._warmup = num_stds, decay, warmup
        self._mean, self._var, self._count = 0.0, 0.0, 0

    def accept(self, loss: float) -> bool:
        if not math.isfinite(loss):
            return False
        if self._count >= self._warmup and self._num_stds > 0:
            if loss > self._mean + self._num_stds * math.sqrt(self._var):
                return False
        self._count += 1
        if self._count == 1:
            self._mean = loss
        else:
            delta = loss - self._mean
            self._mean += (1 - self._decay) * delta
            self._var = self._decay * (self._var + (1 - self._decay) * delta * delta)
        return True


class GradientWorkerNode(program.Worker):
    """A Gorila learner: replay -> gradients on local parameters -> slices to the shards.

    Args:
      builder, spec: the agent and the environment.
      replay_client: the replay node, or a list of the replay shards' nodes; the
        worker samples across all of them and updates priorities.
      shards: clients of all parameter-server shards, in shard order.
      monitor: the monitor node (or None when driven by hand).
      seed: root seed (the shards build the same initial parameters from it).
      worker_index: this worker's index (monitor key "gradient_worker/<i>").
      num_devices: local devices to pmap over; 0 takes them all.
      async_update: pull fresh parameters every this many pushed gradients.
      compression_scheme: one of compression.GRADIENT_SCHEMES.
      outlier_stds: drop gradients whose loss exceeds mean + this many stds; 0 disables.
      report_interval_s: how often counters go to the monitor.
      tf32: TensorFloat-32 matmuls on GPUs (`precision.use_tf32`).
      checkpoint_dir: given to one worker (index 0), which then checkpoints
        the shards and the replay every `checkpoint_interval_steps` global
        updates and when it stops (`save_checkpoint`).
      max_checkpoints_to_keep: older checkpoints (and their replay) are deleted.
      restored_counters: the counters this worker reported last (a restart
        or a resume continues them).
    """

    def __init__(
        self,
        builder: builder_lib.AgentBuilder,
        spec: types.EnvSpec,
        replay_client: program.Client | list[program.Client],
        shards: list[program.Client],
        monitor: program.Client | None,
        seed: int,
        worker_index: int,
        num_devices: int = 0,
        async_update: int = 1,
        compression_scheme: str = "none",
        outlier_stds: float = 0.0,
        report_interval_s: float = 1.0,
        tf32: bool = False,
        checkpoint_dir: str | None = None,
        checkpoint_interval_steps: int = 0,
        max_checkpoints_to_keep: int = 2,
        restored_counters: dict[str, float] | None = None,
    ):
        super().__init__()
        precision.use_tf32(tf32)
        if async_update < 1:
            raise ValueError(f"async_update must be positive, got {async_update}")
        self._builder, self._monitor, self._index = builder, monitor, worker_index
        self._async_update, self._report_interval_s = async_update, report_interval_s
        self._devices = parallel.local_devices(num_devices)
        builder.validate(len(self._devices))
        self._replay = replay.ReplayShards(replay_client)
        self._codec = builder.item_codec(spec)
        key = jax.random.fold_in(jax.random.PRNGKey(seed), 1 + worker_index)
        self._layout, _ = parameter_server.initial_layout(builder, spec, seed, len(shards))
        self._shards = shards
        self._params = parameter_server.ShardedParameters(shards, self._layout)
        self._compressors = [compression.GradientCompressor(compression_scheme) for _ in shards]
        self._outliers = LossOutlierFilter(outlier_stds)
        self._state = builder.init_train_state(key, spec)
        self._replicated = parallel.replicate(self._state, self._devices)
        self._refresh()
        update_fns = builder.update_fns(spec)
        self._grads_fn = parallel.pmap_step(
            update_fns.compute_grads, self._devices, donate_state=False
        )
        # The agent's loss-scale bookkeeping (fp16) after every gradient; an
        # agent without it gets `apply_grads` on overflowed gradients only,
        # which leaves the parameters as they are, as a skipped step does.
        self._track_fn = parallel.pmap_step(
            update_fns.track_grads or update_fns.apply_grads, self._devices
        )
        self._track_every_gradient = update_fns.track_grads is not None
        self._steps = 0
        self._latest_metrics: dict[str, Any] = {}
        self._prefetcher: learner.DevicePrefetcher | None = None
        self._priorities: replay.PriorityUpdater | None = None
        self.counters = {
            "pushed": 0,
            "applied": 0,
            "dropped_stale": 0,
            "dropped_outlier": 0,
            "dropped_nonfinite": 0,
            "staleness_sum": 0,
            "bytes_sent": 0,
        }
        for name, value in (restored_counters or {}).items():
            if name in self.counters:
                self.counters[name] = int(value)
        # Rows sampled per source actor, and the data-balance priority weights.
        self._sampled = balance.SampledRows(restored_counters)
        self._checkpoints = None
        if checkpoint_dir is not None:
            self._checkpoints = checkpoint.LearnerCheckpoints(
                checkpoint_dir, max_checkpoints_to_keep
            )
        self._checkpoint_interval = checkpoint_interval_steps if checkpoint_dir else 0
        self._last_checkpoint_step = self.global_step()
        self._finished = threading.Event()
        self._run_error: BaseException | None = None

    def _refresh(self) -> None:
        self._params.pull()
        self._install_params()

    def global_step(self) -> int:
        """Updates applied run-wide, as agents count them: the mean of the shards' versions."""
        return round(sum(self._versions) / len(self._versions))

    def _install_params(self) -> None:
        """Acts on the parameters `self._params` holds now (after a pull or push_and_get)."""
        self._versions = list(self._params.shard_versions)
        params = self._params.assemble()
        state = self._builder.with_params(self._state, params, self.global_step())
        self._replicated = parallel.replicate_changed(
            state, self._state, self._replicated, self._devices
        )
        self._state = state

    def _start_sampling(self) -> None:
        make_batches = learner.sampler(
            self._replay, self._builder.sample_table, self._codec, self._stop_event
        )
        self._prefetcher = learner.DevicePrefetcher(
            make_batches, self._batch_size, self._devices, self._stop_event
        )
        self._priorities = self._replay.priority_updater(self._builder.sample_table)

    def _batch_size(self) -> int:
        return builder_lib.batch_size_at(self._builder.batch_schedule, int(self._state.step))

    def step_on(self, keys: np.ndarray | None, batch: builder_lib.SampledBatch) -> bool:
        """One gradient from a device batch pushed to all shards; True if it was applied."""
        grads, info = self._grads_fn(self._replicated, batch)
        self._latest_metrics = info.metrics
        scale = None if keys is None else self._sampled.count(keys)
        if keys is not None and info.priorities is not None and self._priorities is not None:
            self._priorities.submit(keys, info.priorities, scale)
        loss = float(np.asarray(info.metrics["loss"])[0])
        finite = True
        checked = grads
        if isinstance(grads, precision.CheckedGrads):  # the agent flags overflowed gradients
            grads, finite = grads.grads, bool(np.asarray(grads.finite)[0])
            if self._track_every_gradient or not finite:
                # Only the loss scale changes; `replicate_changed` keeps the new
                # device copy because `with_params` never replaces it.
                self._replicated = self._track_fn(self._replicated, checked)
        applied = False
        refresh_due = (self._steps + 1) % self._async_update == 0
        if not finite:
            self.counters["dropped_nonfinite"] += 1
        elif self._outliers.accept(loss):
            applied = self._push(grads, refresh_due)
            refresh_due = False  # the pushes brought the new slices back
        else:
            self.counters["dropped_outlier"] += 1
        self._steps += 1
        if refresh_due:
            self._refresh()
        return applied

    def _push(self, grads: Any, refresh: bool) -> bool:
        """Sends one slice to each shard; with `refresh`, takes the new slices from the reply."""
        # One device->host copy of all leaves; the device axis goes in numpy.
        flat = self._layout.flatten(jax.tree.map(lambda x: x[0], jax.device_get(grads)))
        pushes = []
        for index, shard in enumerate(self._shards):
            encoded = self._compressors[index].encode(flat[self._layout.slices[index]])
            self.counters["bytes_sent"] += encoded.nbytes
            held_version = self._versions[index] if refresh else None
            pushes.append(shard.futures.push_and_get(encoded, self._versions[index], held_version))
        results = []
        for index, push in enumerate(pushes):
            result, answer = push.result()
            results.append(result)
            if answer is not None:
                self._params.install(index, *answer)
        if refresh:
            self._install_params()
        applied = all(result.applied for result in results)
        self.counters["pushed"] += 1
        self.counters["applied"] += applied
        self.counters["dropped_stale"] += not applied
        self.counters["staleness_sum"] += max(result.staleness for result in results)
        return applied

    def latest_metrics(self) -> dict[str, float]:
        """The agent's metrics (loss, loss scale, ...) of this worker's latest gradient."""
        return {name: float(np.asarray(value)[0]) for name, value in self._latest_metrics.items()}

    def step(self, timeout: float = 1.0) -> bool:
        if self._prefetcher is None:
            self._start_sampling()
        item = self._prefetcher.get(timeout)
        if item is None:
            return False
        self.step_on(*item)
        return True

    def run(self) -> None:
        # Beats while the first gradient compiles and while replay is below its minimum.
        # Counters and the metrics made from them travel together, so the
        # run's `gradients_applied` always equals its `learner_steps`.
        heartbeat = monitor_lib.Heartbeat(
            self._monitor,
            f"gradient_worker/{self._index}",
            self._heartbeat_counters,
            self._report_interval_s,
            metrics=self._metrics,
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
        while not self.stopping:
            self.step()
            interval = self._checkpoint_interval
            if interval and self.global_step() - self._last_checkpoint_step >= interval:
                self.save_checkpoint()
        # While the replay still serves: the final checkpoint holds every
        # priority sent, and no thread of this worker uses Reverb once it is done.
        self._end_sampling()
        self._report()  # the driver's summary and the final checkpoint read it
        if self._checkpoints is not None:
            self.save_checkpoint()

    def wait_finished(self, timeout: float) -> bool:
        """Blocks until `run` has returned (after a final checkpoint), or timeout.

        Raises:
          RuntimeError: if `run` failed.
        """
        finished = self._finished.wait(timeout)
        if self._run_error is not None:
            name = f"gradient_worker/{self._index}"
            raise RuntimeError(f"{name} failed: {self._run_error!r}") from self._run_error
        return finished

    def save_checkpoint(self) -> int:
        """Checkpoints the replay, then every shard's state, at the current global step.

        Shards go on applying other workers' gradients meanwhile: each
        shard's part is one consistent moment of that shard, and the parts
        lie a few updates apart at most, as any two reads of asynchronous
        shards do. Replay first, old replay checkpoints deleted last, as the
        synchronous learner does (`learner.LearnerNode.save_checkpoint`).

        Returns:
          The global step saved.
        """
        if self._checkpoints is None:
            raise RuntimeError("this worker was built without a checkpoint_dir")
        snapshots = [shard.futures.snapshot() for shard in self._shards]
        state = {"shards": [snapshot.result() for snapshot in snapshots]}
        versions = [int(part["version"]) for part in state["shards"]]
        step = round(sum(versions) / len(versions))
        replay_info = self._replay.checkpoint(step)
        meta = self._monitor.checkpoint_state() if self._monitor is not None else {}
        meta.setdefault("node_counters", {})[f"gradient_worker/{self._index}"] = dict(
            self._heartbeat_counters()
        )
        meta.update(learner_steps=step, replay=replay_info, unix_time=time.time())
        self._checkpoints.save(step, state, meta)
        self._replay.keep_checkpoints(self._checkpoints.steps())
        self._last_checkpoint_step = step
        return step

    def _heartbeat_counters(self) -> dict[str, int]:
        return {
            **self.counters,
            "learner_steps": self.counters["applied"],
            **self._sampled.counters(),
        }

    def set_sample_weights(self, weights: dict[int, float]) -> None:
        """Data balance ("downweight"): new priorities of actor i's items are multiplied by
        weights[i] from the next gradient on (`balance.SampledRows.set_weights`)."""
        self._sampled.set_weights(weights)

    def _metrics(self, counters: dict[str, int]) -> dict[str, float]:
        """What the monitor logs of this worker: its counters and its agent's latest metrics
        (not its rows per actor: one column per actor and worker; the balance report has them)."""
        counters = {k: v for k, v in counters.items() if not k.startswith(balance.SAMPLED_PREFIX)}
        values = {**self.latest_metrics(), **counters}
        return {f"worker{self._index}/{name}": value for name, value in values.items()}

    def _report(self) -> None:
        if self._monitor is None:
            return
        counters = self._heartbeat_counters()
        self._monitor.report(f"gradient_worker/{self._index}", counters, self._metrics(counters))

    def _end_sampling(self) -> None:
        """`learner.end_sampling` of this worker's. Safe to call more than once."""
        prefetcher, priorities = self._prefetcher, self._priorities
        self._prefetcher = self._priorities = None
        learner.end_sampling(prefetcher, priorities)

    def close(self) -> None:
        self._end_sampling()  # if `run` has not (a worker driven by hand)
        if self._checkpoints is not None:
            self._checkpoints.close()
