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


class ParameterShardNode:
    """A program node holding shard `index` of `num_shards` (see `ParameterShard`)."""

    def __init__(
        self,
        builder: builder_lib.AgentBuilder,
        spec: types.EnvSpec,
        seed: int,
        index: int,
        num_shards: int,
        max_staleness: int,
        staleness_scaling: bool = False,
    ):
        layout, flat = parameter_server.initial_layout(builder, spec, seed, num_shards)
        self._shard = parameter_server.ParameterShard(
            flat[layout.slices[index]], builder.shard_optimizer(), max_staleness, staleness_scaling
        )
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

    def counters(self) -> dict[str, int]:
        return dict(self._shard.counters)


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
        versions, params = self._params.pull()
        self._versions = versions
        step = round(sum(versions) / len(versions))  # global updates, as the agent counts steps
        self._state = self._builder.with_params(self._state, params, step)
        self._replicated = parallel.replicate(self._state, self._devices)

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
        if not finite:
            self.counters["dropped_nonfinite"] += 1
            self._replicated = self._skip_fn(self._replicated, checked)
            self._state = parallel.unreplicate(self._replicated)
        elif self._outliers.accept(loss):
            flat = self._layout.flatten(parallel.unreplicate(grads))
            pushes = []
            for index, shard in enumerate(self._shards):
                encoded = self._compressors[index].encode(flat[self._layout.slices[index]])
                self.counters["bytes_sent"] += encoded.nbytes
                pushes.append(shard.futures.push(encoded, self._versions[index]))
            results = [push.result() for push in pushes]
            self.counters["pushed"] += 1
            applied = all(result.applied for result in results)
            self.counters["applied"] += applied
            self.counters["dropped_stale"] += not applied
            self.counters["staleness_sum"] += max(result.staleness for result in results)
        else:
            self.counters["dropped_outlier"] += 1
        self._steps += 1
        if self._steps % self._async_update == 0:
            self._refresh()
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
        pushed = max(self.counters["pushed"], 1)
        metrics = {
            "mean_staleness": self.counters["staleness_sum"] / pushed,
            "bytes_per_update": self.counters["bytes_sent"] / pushed,
        }
        counters = {**self.counters, "learner_steps": self.counters["applied"]}
        self._monitor.futures.report(f"gradient_worker/{self._index}", counters, metrics=metrics)

    def close(self) -> None:
        if self._priorities is not None:
            self._priorities.close()
