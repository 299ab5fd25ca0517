"""Gorila gradient workers: replay -> gradients on local parameters -> slices to the shards."""

import dataclasses
import math
from typing import Any

import jax
import numpy as np

from gorila_jax import builder as builder_lib
from gorila_jax import parallel, precision, types
from gorila_jax.distributed import program
from gorila_jax.gorila import compression, parameter_server
from gorila_jax.health import balance
from gorila_jax.learning import replay_learner
from gorila_jax.learning import settings as learner_settings
from gorila_jax.learning import step as step_lib


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


# A worker's own counters, continued from `restored_counters` by a restart or resume.
_COUNTERS = (
    "pushed",
    "applied",
    "dropped_stale",
    "dropped_outlier",
    "dropped_nonfinite",
    "staleness_sum",
    "bytes_sent",
)


@dataclasses.dataclass(frozen=True)
class WorkerSettings:
    """How a Gorila gradient worker pulls parameters and filters and sends its gradients,
    as one settings object (`ExperimentConfig.worker_settings()`; its fields take their
    defaults from `DEFAULTS`).

    Attributes:
      async_update: pull fresh parameters every this many pushed gradients.
      compression_scheme: one of compression.GRADIENT_SCHEMES.
      outlier_stds: drop gradients whose loss exceeds mean + this many stds; 0 disables.

    Raises:
      ValueError: an async_update below 1.
    """

    async_update: int = 1
    compression_scheme: str = "none"
    outlier_stds: float = 4.0

    def __post_init__(self):
        if self.async_update < 1:
            raise ValueError(f"async_update must be positive, got {self.async_update}")


DEFAULTS = WorkerSettings()


class GradientWorkerNode(replay_learner.ReplayLearnerNode):
    """A Gorila learner: replay -> gradients on local parameters -> slices to the shards.

    Its step is the learner's (`step.make_step`), numeric guard included,
    without applying the gradient: a gradient with a NaN or inf is never
    pushed and its priorities are not sent (`dropped_nonfinite`), as one the
    agent skipped itself (an fp16 overflow) is not pushed.

    Args:
      builder, spec: the agent and the environment.
      replay_client: the replay node, or a list of the replay shards' nodes; the
        worker samples across all of them and updates priorities.
      shards: clients of all parameter-server shards, in shard order.
      monitor: the monitor node (or None when driven by hand).
      seed: root seed (the shards build the same initial parameters from it).
      worker_index: this worker's index (monitor key "<group>/<i>").
      settings: the run's learner settings: devices, reports, TF32 and (worker 0's)
        checkpoints. Its rollback settings do not apply: a worker never applies a
        non-finite gradient, so there is nothing to roll back (a Gorila run refuses
        them: run/combinations.py).
      worker: how it pulls parameters and filters and sends gradients (`WorkerSettings`).
      checkpoint_dir: given to one worker (index 0), which then checkpoints
        the shards and the replay every `settings.checkpoint_interval_steps` global
        updates and when it stops (`save_checkpoint`).
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
        settings: learner_settings.LearnerSettings = learner_settings.DEFAULTS,
        worker: WorkerSettings = DEFAULTS,
        checkpoint_dir: str | None = None,
        restored_counters: dict[str, float] | None = None,
        group: str = "gradient_worker",
    ):
        precision.use_tf32(settings.tf32)
        devices = parallel.local_devices(settings.num_devices)
        builder.validate(len(devices))
        super().__init__(
            builder,
            spec,
            replay_client,
            monitor,
            f"{group}/{worker_index}",
            devices,
            settings,
            checkpoint_dir,
            restored_counters,
        )
        self._index, self._async_update = worker_index, worker.async_update
        key = jax.random.fold_in(jax.random.PRNGKey(seed), 1 + worker_index)
        self._layout, _ = parameter_server.initial_layout(builder, spec, seed, len(shards))
        self._shards = shards
        self._params = parameter_server.ShardedParameters(shards, self._layout)
        self._compressors = [
            compression.GradientCompressor(worker.compression_scheme) for _ in shards
        ]
        self._outliers = LossOutlierFilter(worker.outlier_stds)
        self._state = builder.init_train_state(key, spec)
        self._replicated = parallel.replicate(self._state, self._devices)
        self._refresh()
        self._step_fn = parallel.pmap_step(
            step_lib.make_step(builder, spec, gradient_worker=True),
            self._devices,
            out_axes=step_lib.OUT_AXES,
        )
        self._guard = parallel.replicate(step_lib.init_guard(), self._devices)
        self._steps = 0
        self._latest_metrics: dict[str, Any] = {}
        restored = restored_counters or {}
        self.counters = {name: int(restored.get(name, 0)) for name in _COUNTERS}
        self._checkpoint_interval = settings.checkpoint_interval_steps if checkpoint_dir else 0
        self._last_checkpoint_step = self.global_step()

    def _refresh(self) -> None:
        self._params.pull()
        self._install_params()

    def global_step(self) -> int:
        """Updates applied run-wide, as agents count them: the mean of the shards' versions."""
        return round(sum(self._versions) / len(self._versions))

    def _install_params(self) -> None:
        """Acts on the parameters `self._params` holds now (after a pull or push_and_get).

        Only the parameters (and what `with_params` derives from them) are
        copied to the devices: the rest of the device state is the steps'
        own, the agent's loss scale among it, which `with_params` never replaces.
        """
        self._versions = list(self._params.shard_versions)
        params = self._params.assemble()
        state = self._builder.with_params(self._state, params, self.global_step())
        self._replicated = parallel.replicate_changed(
            state, self._state, self._replicated, self._devices
        )
        self._state = state

    def _rows_to_sample(self) -> int:
        return self._builder.batch_plan.batch_size_at(int(self._state.step))

    def step_on(self, keys: np.ndarray | None, batch: builder_lib.SampledBatch) -> bool:
        """One gradient from a device batch pushed to all shards; True if it was applied."""
        self._replicated, self._guard, info, out = self._step_fn(
            self._replicated, self._guard, batch
        )
        self._latest_metrics = info.metrics
        # One device->host transfer for the outlier filter and the guard's verdict.
        loss, finite, pushable = jax.device_get((out.loss, out.finite, out.pushable))
        self._account(keys, info.priorities if finite else None)
        applied = False
        refresh_due = (self._steps + 1) % self._async_update == 0
        if not pushable:
            self.counters["dropped_nonfinite"] += 1
        elif self._outliers.accept(float(loss)):
            applied = self._push(out.grads, refresh_due)
            refresh_due = False  # the pushes brought the new slices back
        else:
            self.counters["dropped_outlier"] += 1
        self._steps += 1
        if refresh_due:
            self._refresh()
        return applied

    def _push(self, grads: Any, refresh: bool) -> bool:
        """Sends one slice to each shard; with `refresh`, takes the new slices from the reply."""
        flat = self._layout.flatten(jax.device_get(grads))  # one device->host copy of all leaves
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
        item = self._next_batch(timeout)
        if item is None:
            return False
        self.step_on(*item)
        return True

    def _between_steps(self) -> None:
        interval = self._checkpoint_interval
        if interval and self.global_step() - self._last_checkpoint_step >= interval:
            self.save_checkpoint()

    def _checkpoint_contents(self) -> tuple[int, Any, dict[str, Any]]:
        """Every shard's state at the mean of their versions.

        Shards go on applying other workers' gradients meanwhile: each
        shard's part is one consistent moment of that shard, and the parts
        lie a few updates apart at most, as any two reads of asynchronous
        shards do.
        """
        snapshots = [shard.futures.snapshot() for shard in self._shards]
        state = {"shards": [snapshot.result() for snapshot in snapshots]}
        versions = [int(part["version"]) for part in state["shards"]]
        step = round(sum(versions) / len(versions))
        return step, state, {"counters": dict(self._heartbeat_counters())}

    def _heartbeat_counters(self) -> dict[str, int]:
        return {
            **self.counters,
            "learner_steps": self.counters["applied"],
            **self._sampled.counters(),
        }

    def _heartbeat_metrics(self):
        # Counters and the metrics made from them travel together, so the
        # run's `gradients_applied` always equals its `learner_steps`.
        return self._metrics

    def _metrics(self, counters: dict[str, int]) -> dict[str, float]:
        """What the monitor logs of this worker: its counters and its agent's latest metrics
        (not its rows per actor: one column per actor and worker; the balance report has them)."""
        counters = {k: v for k, v in counters.items() if not k.startswith(balance.SAMPLED_PREFIX)}
        values = {**self.latest_metrics(), **self._replay_metrics(), **counters}
        return {f"worker{self._index}/{name}": value for name, value in values.items()}

    def _report(self, block: bool = True) -> None:
        """Counters and metrics to the monitor, always waiting for it (the run's last word)."""
        if self._monitor is None:
            return
        counters = self._heartbeat_counters()
        self._monitor.report(self._name, counters, self._metrics(counters))
