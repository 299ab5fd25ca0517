"""Gorila's sharded parameter server: each shard owns a slice of the flat parameters.

The parameter pytree is flattened into one float32 vector and cut into
`num_shards` contiguous slices of (nearly) equal length, so shards balance by
bytes, not by layer count: one 3136x512 layer would otherwise sit on one shard.
Each shard applies the agent's optimizer to its slice. This is exact for
elementwise optimizers (SGD with momentum, RMSProp, Adam), which is why the
agents clip whole gradients on the workers before they are split.
"""

import concurrent.futures
import threading
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from gorila_jax import builder as builder_lib
from gorila_jax import types
from gorila_jax.distributed import program
from gorila_jax.gorila import compression


class ShardLayout:
    """Splits a pytree into `num_shards` flat float32 slices and joins them back.

    Flattening and joining stay in numpy on the host: a gradient worker does
    both on every update, and per-leaf device ops would cost more than the
    gradient of a small network.

    Args:
      example: a pytree with the parameters' structure, shapes and dtypes.
      num_shards: how many slices.
    """

    def __init__(self, example: Any, num_shards: int):
        leaves, self._treedef = jax.tree.flatten(example)
        self._shapes = [np.shape(leaf) for leaf in leaves]
        self._dtypes = [np.asarray(leaf).dtype for leaf in leaves]
        self._offsets = np.cumsum([0] + [int(np.prod(shape)) for shape in self._shapes])
        self.size = int(self._offsets[-1])
        if num_shards < 1 or num_shards > self.size:
            raise ValueError(f"num_ps_shards must lie in [1, {self.size}], got {num_shards}")
        # np.array_split's rule: the first size % n slices are one longer.
        bounds = np.cumsum(
            [0] + [len(part) for part in np.array_split(np.empty(self.size), num_shards)]
        )
        self.slices = [slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]

    @property
    def num_shards(self) -> int:
        return len(self.slices)

    def flatten(self, tree: Any) -> np.ndarray:
        """One float32 vector of `tree`'s leaves, in `jax.tree.leaves` order."""
        leaves = jax.tree.leaves(tree)
        flat = np.concatenate([np.asarray(leaf, np.float32).ravel() for leaf in leaves])
        if flat.size != self.size:
            raise ValueError(f"expected {self.size} parameters, got {flat.size}")
        return flat

    def split(self, tree: Any) -> list[np.ndarray]:
        flat = self.flatten(tree)
        return [flat[part] for part in self.slices]

    def join(self, parts: list[np.ndarray]) -> Any:
        """The pytree (numpy leaves, original dtypes) from all slices in shard order."""
        if [len(p) for p in parts] != [s.stop - s.start for s in self.slices]:
            raise ValueError(
                f"slice lengths {[len(p) for p in parts]} do not match the layout "
                f"{[s.stop - s.start for s in self.slices]}"
            )
        flat = np.concatenate(parts)
        leaves = [
            flat[start:stop].reshape(shape).astype(dtype, copy=False)
            for start, stop, shape, dtype in zip(
                self._offsets[:-1], self._offsets[1:], self._shapes, self._dtypes
            )
        ]
        return jax.tree.unflatten(self._treedef, leaves)


class PushResult(NamedTuple):
    applied: bool
    version: int  # the shard's version after the push
    staleness: int  # versions applied since the one the gradient was computed on


class ParameterShard:
    """One shard: its parameter slice, its optimizer state and a version counter.

    Reads never wait: `(version, params)` is one tuple swapped in by reference,
    so a reader sees either the old or the new pair, never a half-applied
    update. Pushes are applied one at a time under a lock, so the version goes
    up exactly once per applied update even when workers push concurrently
    (the brief's shard lock). A gradient computed on a version more than
    `max_staleness` behind is dropped and counted (Gorila's staleness rule).

    Args:
      initial: this shard's slice of the initial flat parameters.
      optimizer: an elementwise optax optimizer (the agent's).
      max_staleness: largest accepted version gap; negative accepts any.
      staleness_scaling: scale each update by 1 / (1 + staleness), so a
        gradient computed on older parameters moves them less (Zhang et al.,
        2016). It scales the optimizer's update, not the gradient: Adam
        would undo a scaled gradient.
    """

    def __init__(
        self,
        initial: np.ndarray,
        optimizer: optax.GradientTransformation,
        max_staleness: int = -1,
        staleness_scaling: bool = False,
    ):
        initial = np.asarray(initial, np.float32)
        self._optimizer = optimizer
        self._opt_state = optimizer.init(jnp.asarray(initial))
        self._current = (0, initial)
        self._max_staleness = max_staleness
        self._staleness_scaling = staleness_scaling
        self._update_lock = threading.Lock()
        self._apply = jax.jit(self._apply_fn)
        self.counters = {"applied": 0, "dropped_stale": 0, "staleness_sum": 0, "bytes_in": 0}

    def _apply_fn(self, params, opt_state, grads, scale):
        updates, opt_state = self._optimizer.update(grads, opt_state, params)
        return params + scale * updates, opt_state

    def get(self, held_version: int = -1) -> tuple[int, np.ndarray] | None:
        """(version, slice), or None if the caller holds this version already.

        "Different", not "newer": a shard restored from a checkpoint goes back
        to the checkpoint's version, and its readers must take that slice.
        """
        version, params = self._current
        return None if version == held_version else (version, params)

    def snapshot(self) -> dict[str, Any]:
        """Version, slice and optimizer state, from one moment between two updates."""
        with self._update_lock:
            version, params = self._current
            opt_state = jax.device_get(self._opt_state)
        return {"version": np.asarray(version, np.int64), "params": params, "opt_state": opt_state}

    def restore(self, snapshot: dict[str, Any]) -> None:
        """Takes the state `snapshot` returned (from a checkpoint); counters go on."""
        params = np.asarray(snapshot["params"], np.float32)
        with self._update_lock:
            if params.shape != self._current[1].shape:
                raise ValueError(
                    f"the checkpoint's slice has {params.size} values, "
                    f"this shard {self._current[1].size}"
                )
            self._opt_state = jax.tree.map(jnp.asarray, snapshot["opt_state"])
            self._current = (int(snapshot["version"]), params)

    def push(self, gradient: compression.Encoded, version_used: int) -> PushResult:
        """Applies one (compressed) gradient slice computed on `version_used`."""
        grads = compression.decode(gradient)
        with self._update_lock:
            version, params = self._current
            staleness = version - version_used
            self.counters["bytes_in"] += gradient.nbytes
            if grads.size != params.size:
                raise ValueError(f"gradient slice has {grads.size} values, shard has {params.size}")
            if 0 <= self._max_staleness < staleness:
                self.counters["dropped_stale"] += 1
                return PushResult(False, version, staleness)
            scale = 1.0 / (1 + max(staleness, 0)) if self._staleness_scaling else 1.0
            new_params, self._opt_state = self._apply(
                params, self._opt_state, grads, np.float32(scale)
            )
            self._current = (version + 1, np.asarray(new_params))
            self.counters["applied"] += 1
            self.counters["staleness_sum"] += staleness
            return PushResult(True, version + 1, staleness)


def initial_layout(
    builder: builder_lib.AgentBuilder, spec: types.EnvSpec, seed: int, num_shards: int
):
    """The shard layout and the initial flat parameters, the same in every process."""
    params = builder.state_access.trainable_params(
        builder_lib.initial_train_state(builder, spec, seed)
    )
    layout = ShardLayout(params, num_shards)
    return layout, layout.flatten(params)


class ShardedParameters:
    """Assembles full parameters from all shards; quacks like a learner client for actors.

    The version is the sum of the shards' versions: it grows whenever any
    shard applies an update, which is what "newer" means to an actor.
    """

    def __init__(
        self,
        shards: list[program.Client],
        layout: ShardLayout,
        delta_receiver: str | None = None,
    ):
        self._shards, self._layout = shards, layout
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=2)
        self.shard_versions = [-1] * len(shards)
        self._parts: list[np.ndarray | None] = [None] * len(shards)
        self._receiver = delta_receiver
        self._decoders = [compression.DeltaDecoder() for _ in shards]
        self.bytes_received = 0

    def _request(self, index: int) -> concurrent.futures.Future:
        shard, version = self._shards[index], self.shard_versions[index]
        if self._receiver is None:
            return shard.futures.get(version)
        has_base = self._decoders[index].params is not None
        return shard.futures.get_delta(self._receiver, version, has_base)

    def pull(self) -> bool:
        """Fetches the slices that changed; True if any did.

        With a `delta_receiver` name, slices come as deltas against the copy
        this receiver holds (`compression.DeltaEncoder`).
        """
        requests = [self._request(index) for index in range(len(self._shards))]
        changed = False
        for index, request in enumerate(requests):
            answer = request.result()
            if answer is not None:
                self.install(index, *answer)
                changed = True
        return changed

    def install(self, index: int, version: int, part: Any) -> None:
        """Takes shard `index`'s slice at `version`, as a `get` (or `get_delta`) returned it."""
        self.bytes_received += part.nbytes
        if self._receiver is not None:
            part = self._decoders[index].apply(part)
        self.shard_versions[index], self._parts[index] = version, part

    def assemble(self) -> Any:
        """The full parameter pytree from the slices held now."""
        return self._layout.join(self._parts)

    def get_params(self, newer_than: int = -1) -> tuple[int, Any] | None:
        """(sum of the shards' versions, parameters), or None if nothing changed.

        The sum can go down when a shard is restored from a checkpoint; the
        restored parameters are returned all the same.
        """
        changed = self.pull()
        version = sum(self.shard_versions)
        if version <= newer_than and not changed:
            return None
        return version, self.assemble()

    def close(self) -> None:
        """Waits for the `futures` requests in flight and ends their threads (once unused)."""
        self._pool.shutdown(wait=True, cancel_futures=True)

    @property
    def futures(self) -> "_ShardedFutures":
        """As a node client's `futures` (`program.Client`): `get_params` in the background."""
        return _ShardedFutures(self)


class _ShardedFutures:
    # A class of its own, not one made per call: see `program._Futures`.
    def __init__(self, parameters: ShardedParameters):
        self._parameters = parameters

    def get_params(self, newer_than: int = -1) -> concurrent.futures.Future:
        parameters = self._parameters
        return parameters._pool.submit(parameters.get_params, newer_than)


def sharded_parameters(
    shards: list[program.Client],
    builder: builder_lib.AgentBuilder,
    spec: types.EnvSpec,
    seed: int,
    receiver: str,
) -> ShardedParameters:
    """What actors and evaluators read parameters from in Gorila mode (as deltas)."""
    layout = initial_layout(builder, spec, seed, len(shards))[0]
    return ShardedParameters(shards, layout, delta_receiver=receiver)


def parameter_source(
    learner: Any, builder: builder_lib.AgentBuilder, spec: types.EnvSpec, seed: int, receiver: str
) -> Any:
    """Where a node reads parameters: the learner's client (sync mode) as given, or,
    given the list of shard clients (Gorila mode), a `ShardedParameters` over them."""
    if isinstance(learner, (list, tuple)):
        return sharded_parameters(list(learner), builder, spec, seed, receiver)
    return learner


def close_source(source: Any) -> None:
    """Ends the threads of a `parameter_source` (a `ShardedParameters`); a client has none."""
    if isinstance(source, ShardedParameters):
        source.close()
