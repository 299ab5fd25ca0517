"""Gorila mode (Nair et al., 2015): asynchronous gradient workers and parameter-server shards.

Instead of one synchronous learner, `num_learners` gradient workers each
sample replay, compute gradients on their own (possibly stale) copy of the
parameters, and push one compressed slice to each shard. Shards apply slices
as they arrive with their own optimizer state; nobody waits for anybody.
Two rules from the paper keep this stable: gradients computed on parameters
too many versions old are dropped (at the shard), and gradients whose loss is
an outlier for that worker are dropped (at the worker).
"""

import functools
import math
import threading
import time
from typing import Any

import jax
import numpy as np
import reverb

from gorila_jax import builder as builder_lib
from gorila_jax import (
    compression,
    learner,
    parallel,
    parameter_server,
    precision,
    program,
    replay,
    types,
)


class ParameterShardNode(program.Worker):
    """A program node holding shard `index` of `num_shards` (see `ParameterShard`).

    Its `run` loop only reports: applied and dropped counts and its update
    rate go to the monitor every `report_interval_s`.
    """

    def __init__(
        self,
        builder: builder_lib.AgentBuilder,
        spec: types.EnvSpec,
        seed: int,
        index: int,
        num_shards: int,
        max_staleness: int,
        staleness_scaling: bool = False,
        monitor: program.Client | None = None,
        report_interval_s: float = 1.0,
    ):
        super().__init__()
        layout, flat = parameter_server.initial_layout(builder, spec, seed, num_shards)
        self._shard = parameter_server.ParameterShard(
            flat[layout.slices[index]], builder.shard_optimizer(), max_staleness, staleness_scaling
        )
        self._index, self._monitor = index, monitor
        self._report_interval_s = report_interval_s
        self._encoders: dict[str, compression.DeltaEncoder] = {}
        self._encoders_lock = threading.Lock()

    def get(self, newer_than: int = -1) -> tuple[int, np.ndarray] | None:
        return self._shard.get(newer_than)

    def get_delta(
        self, receiver: str, newer_than: int = -1, has_base: bool = True
    ) -> tuple[int, compression.Encoded] | None:
        """Like `get`, but as a delta against what `receiver` was sent before.

        A receiver without a base (new, or restarted under the same name) says
        so and gets the full slice, so a lost copy never poisons later deltas.
        """
        answer = self._shard.get(newer_than)
        if answer is None:
            return None
        version, params = answer
        with self._encoders_lock:
            if not has_base or receiver not in self._encoders:
                self._encoders[receiver] = compression.DeltaEncoder()
            return version, self._encoders[receiver].encode(params)

    def push(self, gradient: compression.Encoded, version_used: int) -> parameter_server.PushResult:
        return self._shard.push(gradient, version_used)

    def push_and_get(
        self, gradient: compression.Encoded, version_used: int, newer_than: int | None
    ) -> tuple[parameter_server.PushResult, tuple[int, np.ndarray] | None]:
        """`push`, then `get(newer_than)` in the same call (None: no get).

        A worker that refreshes after every push pays one round trip, not two.
        """
        result = self._shard.push(gradient, version_used)
        return result, None if newer_than is None else self._shard.get(newer_than)

    def counters(self) -> dict[str, int]:
        return dict(self._shard.counters)

    def run(self) -> None:
        last_applied, last_time = 0, time.monotonic()
        while not self.sleep(self._report_interval_s):
            if self._monitor is None:
                continue
            counters, now = self.counters(), time.monotonic()
            rate = (counters["applied"] - last_applied) / max(now - last_time, 1e-9)
            last_applied, last_time = counters["applied"], now
            prefix = f"shard{self._index}/"
            metrics = {
                f"{prefix}updates_per_s": rate,
                f"{prefix}applied": counters["applied"],
                f"{prefix}dropped_stale": counters["dropped_stale"],
            }
            # Counters under names the monitor does not total: shards apply
            # updates, they are not extra learner steps.
            self._monitor.futures.report(
                f"parameter_server/{self._index}", {"shard_applied": counters["applied"]}, metrics
            )


def summarize(metrics: dict[str, float]) -> dict[str, float]:
    """Run-wide Gorila figures from what workers and shards report (see their `_report`).

    Sums the per-worker counters over workers: gradients applied and dropped
    (stale, outlier, non-finite), mean staleness and bytes per pushed update.
    """
    totals: dict[str, float] = {}
    for key, value in metrics.items():
        worker, _, name = key.partition("/")
        if worker.startswith("worker") and name:
            totals[name] = totals.get(name, 0) + value
    if not totals:
        return {}
    pushed = max(totals.get("pushed", 0), 1)
    return {
        "gradients_applied": totals.get("applied", 0),
        "dropped_stale": totals.get("dropped_stale", 0),
        "dropped_outlier": totals.get("dropped_outlier", 0),
        "dropped_nonfinite": totals.get("dropped_nonfinite", 0),
        "mean_staleness": totals.get("staleness_sum", 0) / pushed,
        "bytes_per_update": totals.get("bytes_sent", 0) / pushed,
    }


def progress_suffix(row: dict[str, float]) -> str:
    """The progress line's Gorila part: applied/dropped, staleness, bytes, shard rates."""
    if "gradients_applied" not in row:
        return ""
    shard_rates = sorted(
        (key, value) for key, value in row.items() if key.endswith("/updates_per_s")
    )
    rates = ", ".join(f"{value:.1f}" for _, value in shard_rates)
    return (
        f" | applied {row['gradients_applied']:,.0f} dropped "
        f"{row['dropped_stale']:,.0f}/{row['dropped_outlier']:,.0f}/"
        f"{row['dropped_nonfinite']:,.0f} (stale/outlier/nonfinite) | staleness "
        f"{row['mean_staleness']:.2f} | {row['bytes_per_update'] / 1024:,.1f} KiB/update"
        f" | shard updates/s {rates}"
    )


def check_agent(builder: builder_lib.AgentBuilder, spec: types.EnvSpec) -> None:
    """Raises ValueError if the agent's update is not one gradient that shards can apply."""
    update_fns = builder.update_fns(spec)
    if update_fns.compute_grads is None or update_fns.apply_grads is None:
        raise ValueError(
            f"learner_mode=gorila needs an agent whose update is one gradient "
            f"(UpdateFns.compute_grads and apply_grads); {type(builder).__name__} gives "
            "only a whole update step: use learner_mode=sync"
        )


def add_nodes(
    graph: program.Program,
    builder: builder_lib.AgentBuilder,
    cfg: Any,
    spec: types.EnvSpec,
    replay_node: program.Handle,
    monitor_node: program.Handle,
) -> list[program.Handle]:
    """The parameter-server and gradient-worker groups of an ExperimentConfig `cfg`.

    Returns:
      The shard handles: what actors and the evaluator read parameters from.
    """
    check_agent(builder, spec)
    with graph.group("parameter_server", program.Resources(cfg.ps_cpus)):
        shards = [
            graph.add_node(
                ParameterShardNode,
                builder,
                spec,
                cfg.seed,
                index,
                cfg.num_ps_shards,
                cfg.max_staleness,
                cfg.staleness_lr_scaling,
                monitor_node,
            )
            for index in range(cfg.num_ps_shards)
        ]
    resources = program.Resources(cfg.learner_cpus, cfg.learner_gpus)
    with graph.group("gradient_worker", resources):
        for index in range(cfg.num_learners):
            graph.add_node(
                GradientWorkerNode,
                builder,
                spec,
                replay_node,
                shards,
                monitor_node,
                cfg.seed,
                index,
                num_devices=cfg.num_learner_devices,
                async_update=cfg.async_update,
                compression_scheme=cfg.compression,
                outlier_stds=cfg.outlier_stds,
                tf32=cfg.tf32,
            )
    return shards


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
      replay_client: the replay node; the worker samples and updates priorities.
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
    """

    def __init__(
        self,
        builder: builder_lib.AgentBuilder,
        spec: types.EnvSpec,
        replay_client: program.Client,
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
    ):
        super().__init__()
        precision.use_tf32(tf32)
        if async_update < 1:
            raise ValueError(f"async_update must be positive, got {async_update}")
        self._builder, self._monitor, self._index = builder, monitor, worker_index
        self._async_update, self._report_interval_s = async_update, report_interval_s
        self._devices = parallel.local_devices(num_devices)
        builder.validate(len(self._devices))
        self._server_address = replay_client.address()
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
        # Run only on overflowed gradients: it leaves the parameters as they
        # are and lowers the worker's loss scale (fp16), as a skipped step does.
        self._skip_fn = parallel.pmap_step(update_fns.apply_grads, self._devices)
        self._steps = 0
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

    def _refresh(self) -> None:
        self._params.pull()
        self._install_params()

    def _install_params(self) -> None:
        """Acts on the parameters `self._params` holds now (after a pull or push_and_get)."""
        self._versions = list(self._params.shard_versions)
        params = self._params.assemble()
        step = round(sum(self._versions) / len(self._versions))  # global updates, as agents count
        state = self._builder.with_params(self._state, params, step)
        self._replicated = parallel.replicate_changed(
            state, self._state, self._replicated, self._devices
        )
        self._state = state

    def _start_sampling(self) -> None:
        make_batches = functools.partial(
            learner.sampler, self._server_address, self._builder.sample_table, self._codec
        )
        self._prefetcher = learner.DevicePrefetcher(
            make_batches, self._batch_size, self._devices, self._stop_event
        )
        self._priorities = replay.PriorityUpdater(
            reverb.Client(self._server_address), self._builder.sample_table
        )

    def _batch_size(self) -> int:
        return builder_lib.batch_size_at(self._builder.batch_schedule, int(self._state.step))

    def step_on(self, keys: np.ndarray | None, batch: builder_lib.SampledBatch) -> bool:
        """One gradient from a device batch pushed to all shards; True if it was applied."""
        grads, info = self._grads_fn(self._replicated, batch)
        if keys is not None and info.priorities is not None and self._priorities is not None:
            self._priorities.submit(keys, info.priorities)
        loss = float(np.asarray(info.metrics["loss"])[0])
        finite = True
        checked = grads
        if isinstance(grads, precision.CheckedGrads):  # the agent flags overflowed gradients
            grads, finite = grads.grads, bool(np.asarray(grads.finite)[0])
        applied = False
        refresh_due = (self._steps + 1) % self._async_update == 0
        if not finite:
            self.counters["dropped_nonfinite"] += 1
            self._replicated = self._skip_fn(self._replicated, checked)
            self._state = parallel.unreplicate(self._replicated)
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
            newer_than = self._versions[index] if refresh else None
            pushes.append(shard.futures.push_and_get(encoded, self._versions[index], newer_than))
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

    def step(self, timeout: float = 1.0) -> bool:
        if self._prefetcher is None:
            self._start_sampling()
        item = self._prefetcher.get(timeout)
        if item is None:
            return False
        self.step_on(*item)
        return True

    def run(self) -> None:
        last_report = 0.0
        while not self.stopping:
            self.step()
            if time.monotonic() - last_report >= self._report_interval_s:
                self._report()
                last_report = time.monotonic()
        self._report()

    def _report(self) -> None:
        if self._monitor is None:
            return
        prefix = f"worker{self._index}/"
        metrics = {prefix + name: value for name, value in self.counters.items()}
        counters = {**self.counters, "learner_steps": self.counters["applied"]}
        self._monitor.futures.report(f"gradient_worker/{self._index}", counters, metrics=metrics)

    def close(self) -> None:
        if self._priorities is not None:
            self._priorities.close()
