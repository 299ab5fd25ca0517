"""The parameter-server shard as a program node, and the Gorila checkpoint it restores from."""

import dataclasses
import logging
import threading
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from gorila_jax import builder as builder_lib
from gorila_jax import types
from gorila_jax.distributed import program
from gorila_jax.gorila import compression, parameter_server
from gorila_jax.health.monitor import HEARTBEAT_INTERVAL_S
from gorila_jax.learning import checkpoint, sync_learner


@dataclasses.dataclass(frozen=True)
class ShardSettings:
    """How a parameter-server shard applies gradients and reports, as one settings object
    (`ExperimentConfig.shard_settings()`; its fields take their defaults from `DEFAULTS`).

    Attributes:
      max_staleness: a gradient more versions behind than this is dropped and counted;
        negative keeps all (`ParameterShard`).
      staleness_scaling: scale each update by 1 / (1 + its staleness).
      heartbeat_interval_s: how often counters go to the monitor.

    Raises:
      ValueError: a heartbeat interval that is not positive.
    """

    max_staleness: int = 8
    staleness_scaling: bool = False
    heartbeat_interval_s: float = HEARTBEAT_INTERVAL_S

    def __post_init__(self):
        if not self.heartbeat_interval_s > 0:
            raise ValueError(
                f"heartbeat_interval_s must be positive, got {self.heartbeat_interval_s}"
            )


DEFAULTS = ShardSettings()


class ParameterShardNode(program.Worker):
    """A program node holding shard `index` of `num_shards` (see `ParameterShard`), which
    applies gradients and reports as `settings` say.

    Its `run` loop only reports: applied and dropped counts and its update
    rate go to the monitor every `settings.heartbeat_interval_s`.

    With `checkpoint_dir` and `restore_step` (a step, or `NEWEST` for a
    restarted shard) it starts from its part of that Gorila checkpoint
    (`GradientWorkerNode.save_checkpoint`) instead of the initial parameters.
    """

    def __init__(
        self,
        builder: builder_lib.AgentBuilder,
        spec: types.EnvSpec,
        seed: int,
        index: int,
        num_shards: int,
        settings: ShardSettings = DEFAULTS,
        monitor: program.Client | None = None,
        checkpoint_dir: str | None = None,
        restore_step: int | None = None,
        group: str = "parameter_server",
    ):
        super().__init__()
        self.name = f"{group}/{index}"  # a role's shards: "parameter_server@<role>/<index>"
        layout, flat = parameter_server.initial_layout(builder, spec, seed, num_shards)
        self._shard = parameter_server.ParameterShard(
            flat[layout.slices[index]],
            builder.shard_optimizer(),
            settings.max_staleness,
            settings.staleness_scaling,
        )
        if restore_step is not None:
            if checkpoint_dir is None:
                raise ValueError("restore_step needs a checkpoint_dir")
            template = checkpoint_template(builder, spec, seed, num_shards)
            step, state = _restore(checkpoint_dir, restore_step, template)
            self._shard.restore(state["shards"][index])
            logging.warning("%s: restored from checkpoint %d", self.name, step)
        self._index, self._monitor = index, monitor
        self.settings = settings
        self._encoders: dict[str, compression.DeltaEncoder] = {}
        self._encoders_lock = threading.Lock()
        # Parameter bytes this shard sent to readers (workers, actors, caches,
        # the evaluator): the shard's side of the learner's params_bytes_served.
        self._bytes_served = 0
        self._served_lock = threading.Lock()

    def _served(self, answer: tuple[int, Any] | None) -> tuple[int, Any] | None:
        if answer is not None:
            with self._served_lock:
                self._bytes_served += int(answer[1].nbytes)
        return answer

    def get(self, held_version: int = -1) -> tuple[int, np.ndarray] | None:
        return self._served(self._shard.get(held_version))

    def snapshot(self) -> dict[str, Any]:
        return self._shard.snapshot()

    def get_delta(
        self, receiver: str, held_version: int = -1, has_base: bool = True
    ) -> tuple[int, compression.Encoded] | None:
        """Like `get`, but as a delta against what `receiver` was sent before.

        A receiver without a base (new, or restarted under the same name) says
        so and gets the full slice, so a lost copy never poisons later deltas.
        """
        answer = self._shard.get(held_version)
        if answer is None:
            return None
        version, params = answer
        with self._encoders_lock:
            if not has_base or receiver not in self._encoders:
                self._encoders[receiver] = compression.DeltaEncoder()
            encoded = self._encoders[receiver].encode(params)
        return self._served((version, encoded))

    def push(self, gradient: compression.Encoded, version_used: int) -> parameter_server.PushResult:
        return self._shard.push(gradient, version_used)

    def push_and_get(
        self, gradient: compression.Encoded, version_used: int, held_version: int | None
    ) -> tuple[parameter_server.PushResult, tuple[int, np.ndarray] | None]:
        """`push`, then `get(held_version)` in the same call (None: no get).

        A worker that refreshes after every push pays one round trip, not two.
        """
        result = self._shard.push(gradient, version_used)
        return result, None if held_version is None else self.get(held_version)

    def counters(self) -> dict[str, int]:
        """The shard's update counters, and `bytes_served`: parameter bytes sent to readers."""
        with self._served_lock:
            return {**self._shard.counters, "bytes_served": self._bytes_served}

    def run(self) -> None:
        last_applied, last_time = 0, time.monotonic()
        while not self.sleep(self.settings.heartbeat_interval_s):
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
                f"{prefix}params_bytes_served": counters["bytes_served"],
                # Per version the shard made: what each update costs its readers.
                f"{prefix}params_bytes_served_per_version": (
                    counters["bytes_served"] / max(self._shard.get()[0], 1)
                ),
            }
            # Counters under names the monitor does not total: shards apply
            # updates, they are not extra learner steps. Pushes move even
            # when every gradient is dropped: the shard is not stalled then.
            heartbeat = {
                "shard_applied": counters["applied"],
                "shard_pushes": counters["applied"] + counters["dropped_stale"],
            }
            self._monitor.futures.report(self.name, heartbeat, metrics)


def checkpoint_template(
    builder: builder_lib.AgentBuilder, spec: types.EnvSpec, seed: int, num_shards: int
) -> dict[str, Any]:
    """What a Gorila checkpoint holds, at the initial values: each shard's `snapshot`.

    The restore target (structure, shapes, dtypes): a checkpoint saved with
    another number of shards or another network does not load.
    """
    layout, flat = parameter_server.initial_layout(builder, spec, seed, num_shards)
    optimizer = builder.shard_optimizer()
    return {
        "shards": [
            {
                "version": np.asarray(0, np.int64),
                "params": flat[part],
                "opt_state": jax.device_get(optimizer.init(jnp.asarray(flat[part]))),
            }
            for part in layout.slices
        ]
    }


def _restore(directory: str, step: int, template: Any) -> tuple[int, Any]:
    """(step, state) of checkpoint `step`, or of the newest that loads for `sync_learner.NEWEST`.

    Raises:
      checkpoint.CheckpointError: `NEWEST` and none loads. A shard that
        started from its initial slice instead would silently undo training.
    """
    checkpoints = checkpoint.LearnerCheckpoints(directory, read_only=True)
    if step != sync_learner.NEWEST:
        return step, checkpoints.restore(step, template)[0]
    newest = checkpoints.restore_newest(template, "parameter_server")
    if newest is None:
        raise checkpoint.CheckpointError(
            f"a restarted shard has no checkpoint to restore in {directory}: its slice is lost"
        )
    return newest[0], newest[1]
