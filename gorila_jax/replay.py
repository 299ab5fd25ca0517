"""Reverb replay: the server node, table factories, batched sampling, priority updates.

The interface actors and learners see stays narrow (server address, items
with priorities, batches with keys and probabilities, priority updates), so
that another backend can one day sit behind it (DESIGN.md, replay node).
"""

import errno
import json
import logging
import os
import queue
import shutil
import socket
import threading
from typing import Any, Callable, Iterator, NamedTuple, Sequence

import numpy as np
import reverb
import tensorflow as tf
import tree
from reverb.cc.checkpointing import checkpoint_pb2

from gorila_jax import types


def _ray_node_ip() -> str | None:
    try:
        import ray

        return ray.util.get_node_ip_address() if ray.is_initialized() else None
    except ImportError:
        return None


# The source of an item written without one (tests, tools): counted apart, never as an actor.
UNKNOWN_SOURCE = -1
_SOURCE_DTYPE = np.dtype(np.int32)
SOURCE_BYTES = _SOURCE_DTYPE.itemsize


class ItemCodec:
    """Packs each item (a pytree of fixed-shape arrays) into one uint8 vector, and back.

    Reverb keeps every leaf of an item in a column of its own, and it pays per
    column on insert (a chunk to build and compress) and on sample (a chunk to
    find and decompress). One column instead of five doubles both rates for
    CartPole transitions: about 7.6k -> 14.8k inserts/s and 36k -> 82k sampled
    items/s on 2 cores (bench/learner_throughput.py measures the result).
    Batches are packed and unpacked with a few vectorized numpy calls.

    Every packed item ends with a trailer of SOURCE_BYTES: the index of the
    actor that wrote it (int32, `UNKNOWN_SOURCE` if the writer named none).
    The learners read it (`sources`) to count each actor's share of what
    they sample (gorila_jax/balance.py) and to scale the priorities of a
    dominant actor's items; agents never see it (`decode` drops it). It
    rides inside the one column, so it costs no extra Reverb column.

    Args:
      example: one item, without a batch axis (e.g. a `types.Transition`).
    """

    def __init__(self, example: types.PyTree):
        leaves = [np.asarray(x) for x in tree.flatten(example)]
        self._structure = example
        self._shapes = [leaf.shape for leaf in leaves]
        self._dtypes = [leaf.dtype for leaf in leaves]
        sizes = [leaf.nbytes for leaf in leaves]
        self._bounds = np.cumsum([0, *sizes]).tolist()
        self.payload_bytes = self._bounds[-1]  # the item's own data, without the trailer
        self.num_bytes = self.payload_bytes + SOURCE_BYTES  # one packed item

    def signature(self) -> tf.TensorSpec:
        """The table signature of packed items."""
        return tf.TensorSpec([self.num_bytes], tf.uint8)

    def encode(self, batch: types.PyTree, source: int | np.ndarray = UNKNOWN_SOURCE) -> np.ndarray:
        """[K, ...] leaves -> [K, num_bytes] uint8.

        Args:
          batch: items with a leading batch axis.
          source: the index of the actor that wrote them (one for all, or [K]).
        """
        leaves = tree.flatten(batch)
        count = len(leaves[0])
        parts = [
            np.ascontiguousarray(leaf, dtype).reshape(count, -1).view(np.uint8)
            for leaf, dtype in zip(leaves, self._dtypes)
        ]
        sources = np.broadcast_to(np.asarray(source, _SOURCE_DTYPE), (count,))
        parts.append(np.ascontiguousarray(sources).reshape(count, 1).view(np.uint8))
        return np.concatenate(parts, axis=1)

    def describe(self) -> str:
        """The leaves' shapes and dtypes, for error messages."""
        leaves = ", ".join(
            f"{dtype}{list(shape)}" for shape, dtype in zip(self._shapes, self._dtypes)
        )
        return f"{leaves}, {SOURCE_BYTES}-byte source actor"

    def _check(self, packed: np.ndarray, table: str | None) -> np.ndarray:
        packed = np.asarray(packed)
        if packed.ndim != 2 or packed.shape[1] != self.num_bytes or packed.dtype != np.uint8:
            where = f"replay table {table!r}: " if table else ""
            if packed.ndim == 2 and packed.shape[1] == self.payload_bytes:
                why = (
                    "these items lack the source-actor trailer: they were written by an "
                    "older gorila-jax (a replay checkpoint from before items named their actor?)"
                )
            else:
                why = (
                    "the table holds items of another agent config or environment "
                    "(a replay checkpoint of another run?)"
                )
            raise ValueError(
                f"{where}packed items must be [B, {self.num_bytes}] uint8 ({self.describe()}), "
                f"got {packed.dtype}{list(packed.shape)}; {why}"
            )
        return packed

    def decode(self, packed: np.ndarray, table: str | None = None) -> types.PyTree:
        """[B, num_bytes] uint8 -> the item structure with [B, ...] leaves (no trailer).

        Raises:
          ValueError: packed items of another width or dtype, naming `table` and
            both layouts: bytes decoded with the wrong layout would be silent garbage.
        """
        packed = self._check(packed, table)
        count = packed.shape[0]
        leaves = [
            np.ascontiguousarray(packed[:, start:stop]).view(dtype).reshape(count, *shape)
            for start, stop, dtype, shape in zip(
                self._bounds[:-1], self._bounds[1:], self._dtypes, self._shapes
            )
        ]
        return tree.unflatten_as(self._structure, leaves)

    def sources(self, packed: np.ndarray, table: str | None = None) -> np.ndarray:
        """[B, num_bytes] uint8 -> [B] int32, the actor that wrote each item.

        Raises:
          ValueError: as `decode`.
        """
        packed = self._check(packed, table)
        trailer = np.ascontiguousarray(packed[:, self.payload_bytes :])
        return trailer.view(_SOURCE_DTYPE).reshape(-1)


def rate_limiter(
    samples_per_insert: float, min_size: int, batch_size: int, tolerance: float = 0.1
) -> reverb.rate_limiters.SampleToInsertRatio:
    """Keeps samples/inserts near `samples_per_insert` once `min_size` items exist.

    The allowed deviation (Reverb's error buffer) is the largest of: Acme's
    rule (`tolerance` of the minimum size's worth of samples), Reverb's floor
    of 2*max(1, spi), and 16 batches. The last one matters: the learner keeps
    several batches in flight (tf.data prefetch, device prefetch); a buffer
    smaller than that makes learner and actors wait on each other's latency
    instead of running side by side.
    """
    if samples_per_insert <= 0:
        raise ValueError(f"samples_per_insert must be positive, got {samples_per_insert}")
    if min_size < 1:
        raise ValueError(f"min_replay_size must be positive, got {min_size}")
    error_buffer = max(
        min_size * samples_per_insert * tolerance,
        2.0 * max(1.0, samples_per_insert),
        16.0 * batch_size,
    )
    return reverb.rate_limiters.SampleToInsertRatio(samples_per_insert, min_size, error_buffer)


def prioritized_table(
    name: str,
    max_size: int,
    priority_exponent: float,
    limiter: reverb.rate_limiters.RateLimiter,
    signature: Any,
) -> reverb.Table:
    """Prioritized experience replay (Schaul et al., 2016) with FIFO removal."""
    if max_size < 1:
        raise ValueError(f"replay max_size must be positive, got {max_size}")
    return reverb.Table(
        name=name,
        sampler=reverb.selectors.Prioritized(priority_exponent),
        remover=reverb.selectors.Fifo(),
        max_size=max_size,
        rate_limiter=limiter,
        signature=signature,
    )


def uniform_table(
    name: str,
    max_size: int,
    limiter: reverb.rate_limiters.RateLimiter,
    signature: Any,
) -> reverb.Table:
    """Uniform sampling with FIFO removal (SAC and other off-policy agents without PER)."""
    if max_size < 1:
        raise ValueError(f"replay max_size must be positive, got {max_size}")
    return reverb.Table(
        name=name,
        sampler=reverb.selectors.Uniform(),
        remover=reverb.selectors.Fifo(),
        max_size=max_size,
        rate_limiter=limiter,
        signature=signature,
    )


def queue_table(name: str, max_size: int, signature: Any) -> reverb.Table:
    """Each item is sampled exactly once, oldest first (on-policy agents such as PPO).

    A full queue blocks writers: with `max_size` = k learner batches, actors
    run at most k batches (about k parameter versions) ahead of the learner.
    """
    if max_size < 1:
        raise ValueError(f"queue max_size must be positive, got {max_size}")
    return reverb.Table.queue(name=name, max_size=max_size, signature=signature)


CHECKPOINT_MANIFEST = "MANIFEST.json"


NEWEST = -1  # ReplayNode restore_step: the newest intact checkpoint


class CheckpointDamaged(Exception):
    """A replay checkpoint whose files are not those that were written."""


class IncompatibleCheckpoint(Exception):
    """A replay checkpoint whose items this run's agent cannot read (another format or config)."""


def _lacks_source_trailer(held: Any, configured: Any) -> bool:
    """Whether `held` is `configured` (packed items) less the source-actor trailer."""
    packed = [
        isinstance(spec, tf.TensorSpec) and spec.dtype == tf.uint8 and spec.shape.rank == 1
        for spec in (held, configured)
    ]
    return all(packed) and held.shape[0] + SOURCE_BYTES == configured.shape[0]


class PortInUse(OSError):
    """The replay server's port is taken by another process."""


def _check_port_free(port: int) -> None:
    """Raises PortInUse, naming the port, if a listener holds it on any interface.

    Reverb binds `[::]:port` (every interface) and, when that fails, says only
    "Failed to BuildAndStart gRPC server". SO_REUSEADDR as gRPC sets it: the
    connections of a killed predecessor (TIME_WAIT) do not count as a user.
    """
    if not 0 < port < 65536:
        raise ValueError(f"replay port must be in 1..65535, got {port}")
    for family, address in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        try:
            probe = socket.socket(family, socket.SOCK_STREAM)
        except OSError:  # no IPv6 on this host
            continue
        with probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((address, port))
            except OSError as error:
                if error.errno == errno.EADDRINUSE:
                    raise PortInUse(
                        f"replay port {port} is already in use by another process "
                        "(choose another --replay_port, or 0 for a free one)"
                    ) from None
                if family == socket.AF_INET6:
                    continue  # IPv6 present but not bindable here; IPv4 decides
                raise


def newest_intact_checkpoint(checkpoint_dir: str) -> int | None:
    """The step of the newest replay checkpoint in `checkpoint_dir` whose files are
    intact (`check_checkpoint`); None if there is none. Damaged ones are skipped
    with a warning: a restarted replay goes back one checkpoint rather than fail."""
    steps = (
        sorted((int(name) for name in os.listdir(checkpoint_dir) if name.isdigit()), reverse=True)
        if os.path.isdir(checkpoint_dir)
        else []
    )
    for step in steps:
        try:
            check_checkpoint(os.path.join(checkpoint_dir, str(step)))
            return step
        except CheckpointDamaged as error:
            logging.warning("replay: skipping checkpoint %d: %s", step, error)
    return None


class ReplayNode:
    """Hosts a Reverb server with the tables an agent's builder declares.

    Reverb's server listens on every interface of its host (gRPC on
    `[::]:port`, without authentication: Reverb has no option for either);
    keep the replay port closed to untrusted networks (README, multi-host).

    Args:
      make_tables: returns the agent's tables.
      port: the server's port; None picks a free one. The experiment picks
        one for the whole run, so that a restarted replay node serves at the
        same address and Reverb's clients (writers, samplers) reconnect to it.
      checkpoint_dir: where `checkpoint` writes (`<logdir>/checkpoints/replay`,
        absolute); None: no checkpoints.
      restore_step: start from the checkpoint taken at this learner step;
        `NEWEST`: from the newest intact one (an empty replay if there is none),
        as a replay node restarted after a crash does.

    Raises:
      PortInUse: `port` is taken by another process.
    """

    def __init__(
        self,
        make_tables: Callable[[], Sequence[reverb.Table]],
        port: int | None = None,
        checkpoint_dir: str | None = None,
        restore_step: int | None = None,
    ):
        self._checkpoint_dir = checkpoint_dir
        checkpointer = None
        expected_sizes = None
        if checkpoint_dir is not None:
            if restore_step == NEWEST:
                restore_step = newest_intact_checkpoint(checkpoint_dir)
            restore_path = None
            if restore_step is not None:
                restore_path = os.path.join(checkpoint_dir, str(restore_step))
                expected_sizes = check_checkpoint(restore_path)
            checkpointer = _checkpointer(checkpoint_dir, restore_path)
        elif restore_step is not None and restore_step != NEWEST:
            raise ValueError("restore_step needs a checkpoint_dir")
        else:
            restore_step = None  # NEWEST without checkpoints: an empty replay
        tables = list(make_tables())
        signatures = {table.info.name: table.info.signature for table in tables}
        if port is not None:
            _check_port_free(port)
        try:
            self._server = reverb.Server(tables, port=port, checkpointer=checkpointer)
        except ValueError as error:
            if port is not None and "BuildAndStart" in str(error):
                # Taken between the check and the bind; Reverb's message names no port.
                raise PortInUse(f"replay port {port} is already in use ({error})") from None
            raise
        self._host = _ray_node_ip() or socket.gethostbyname("localhost")
        self._restored = {"step": restore_step, "table_sizes": expected_sizes or {}}
        if expected_sizes is not None:
            self._check_restored(expected_sizes, restore_step)
            self._check_signatures(signatures, restore_step)
            logging.warning(
                "replay: restored the checkpoint of learner step %d, tables %s",
                restore_step,
                expected_sizes,
            )

    def restored_from(self) -> dict[str, Any]:
        """{"step": the learner step of the checkpoint restored (None: started empty),
        "table_sizes": its table sizes, which the tables held right after the restore}."""
        return dict(self._restored)

    def _check_restored(self, expected: dict[str, int], step: int) -> None:
        sizes = {name: info["size"] for name, info in self.table_info().items()}
        if sizes != expected:
            self._server.stop()
            raise RuntimeError(
                f"replay checkpoint {self._checkpoint_dir}/{step} restored tables of sizes "
                f"{sizes}, it holds {expected}; it is damaged (delete it to resume from an "
                "older checkpoint)"
            )

    def _check_signatures(self, configured: dict[str, Any], step: int) -> None:
        """Raises IncompatibleCheckpoint if a restored table's items are not this run's.

        Reverb restores a table with the signature in its checkpoint, whatever
        the configured one: without this check the writers' inserts fail
        and the learner decodes garbage widths, far from the cause.
        """
        restored = self._server.localhost_client().server_info()
        for name, signature in configured.items():
            held = restored[name].signature if name in restored else None
            if signature is None or held is None or held == signature:
                continue
            self._server.stop()
            path = f"{self._checkpoint_dir}/{step}"
            if _lacks_source_trailer(held, signature):
                raise IncompatibleCheckpoint(
                    f"replay checkpoint {path}: table {name!r} holds items of {held.shape[0]} "
                    f"bytes, written before items carried the actor that wrote them (this "
                    f"version's items are {signature.shape[0]} bytes: a {SOURCE_BYTES}-byte "
                    "source-actor trailer, gorila_jax/replay.py ItemCodec); resume it with the "
                    "version that wrote it, or start the run afresh (a new logdir, or without "
                    "--resume)"
                )
            raise IncompatibleCheckpoint(
                f"replay checkpoint {path}: table {name!r} holds items {held}, this run's "
                f"agent writes {signature}: it is a checkpoint of another agent config or "
                "environment"
            )

    def address(self) -> str:
        """host:port that clients on any node of the cluster can reach."""
        return f"{self._host}:{self._server.port}"

    def table_info(self) -> dict[str, dict[str, float]]:
        """Per table: size, completed inserts and samples, and the rate limiter's settings
        (`samples_per_insert`, and `slack`: how far sampling may run ahead of or behind it)."""
        info = self._server.localhost_client().server_info()
        return {
            name: {
                "size": t.current_size,
                "inserts": t.rate_limiter_info.insert_stats.completed,
                "samples": t.rate_limiter_info.sample_stats.completed,
                "samples_per_insert": t.rate_limiter_info.samples_per_insert,
                "slack": (t.rate_limiter_info.max_diff - t.rate_limiter_info.min_diff) / 2,
            }
            for name, t in info.items()
        }

    def checkpoint(self, step: int) -> dict[str, Any]:
        """Checkpoints every table (items, priorities, rate-limiter counts) as learner step `step`.

        Reverb writes into a scratch directory; the finished checkpoint is
        renamed to `<checkpoint_dir>/<step>` (replacing one there), so a
        partial one never carries a step's name.

        Returns:
          {"path": the checkpoint's directory, "table_sizes": {table: items}}.
        """
        if self._checkpoint_dir is None:
            raise RuntimeError("this replay node was built without a checkpoint_dir")
        written = self._server.localhost_client().checkpoint()
        sizes = _write_manifest(written)
        final = os.path.join(self._checkpoint_dir, str(step))
        if os.path.exists(final):
            shutil.rmtree(final)
        os.rename(written, final)
        return {"path": final, "table_sizes": sizes}

    def keep_checkpoints(self, steps: Sequence[int]) -> None:
        """Deletes the checkpoints of every step not in `steps`."""
        kept = set(steps)
        for name in os.listdir(self._checkpoint_dir):
            if name.isdigit() and int(name) not in kept:
                shutil.rmtree(os.path.join(self._checkpoint_dir, name), ignore_errors=True)

    def close(self) -> None:
        self._server.stop()


def _checkpointer(
    checkpoint_dir: str, restore_path: str | None
) -> reverb.checkpointers.DefaultCheckpointer:
    """A Reverb checkpointer that writes to a scratch directory and loads `restore_path`.

    Reverb loads the newest checkpoint of its own directory and falls back to
    `restore_path` only when that directory is empty; emptying it first means
    exactly the checkpoint that resume chose is loaded (or none).
    """
    scratch = os.path.join(checkpoint_dir, ".reverb")
    shutil.rmtree(scratch, ignore_errors=True)  # leftovers of a checkpoint cut short
    os.makedirs(scratch)
    return reverb.checkpointers.DefaultCheckpointer(scratch, fallback_checkpoint_path=restore_path)


def check_checkpoint(path: str) -> dict[str, int]:
    """Table sizes of the replay checkpoint at `path`, after checking its files are intact.

    Raises:
      CheckpointDamaged: if the manifest, or a file it lists, is missing or has another size.
    """
    try:
        with open(os.path.join(path, CHECKPOINT_MANIFEST)) as f:
            manifest = json.load(f)
    except (OSError, ValueError) as error:
        raise CheckpointDamaged(
            f"replay checkpoint {path} has no readable manifest: {error}"
        ) from None
    for name, size in manifest["files"].items():
        file = os.path.join(path, name)
        actual = os.path.getsize(file) if os.path.exists(file) else None
        if actual != size:
            raise CheckpointDamaged(
                f"replay checkpoint file {file} has {actual} bytes, {size} were written"
            )
    return manifest["table_sizes"]


def _write_manifest(path: str) -> dict[str, int]:
    """Records the size of every file of the Reverb checkpoint at `path`; returns table sizes.

    Reverb restores a truncated checkpoint as an empty table without an error;
    the manifest lets resume tell a damaged checkpoint from an intact one.
    """
    sizes = {}
    tables = tf.data.TFRecordDataset(
        os.path.join(path, "tables.tfrecord"),
        compression_type="ZLIB",  # Reverb's format
    )
    for record in tables.as_numpy_iterator():
        table = checkpoint_pb2.PriorityTableCheckpoint.FromString(record)
        limiter = table.rate_limiter
        sizes[table.table_name] = int(limiter.insert_count - limiter.delete_count)
    files = {name: os.path.getsize(os.path.join(path, name)) for name in os.listdir(path)}
    with open(os.path.join(path, CHECKPOINT_MANIFEST), "w") as f:
        json.dump({"files": files, "table_sizes": sizes}, f)
    return sizes


class ReplayClient(reverb.Client):
    """A Reverb client of the replay node that can find the node's server again.

    A restarted replay node normally serves at the same address (the run
    keeps its port), and Reverb's clients reconnect there by themselves. If
    the replacement came up elsewhere (another host), `current_address`
    asks the node (through its program client, which waits for the
    replacement) where it serves now; `TransitionWriter` does so when its
    server stops answering.

    Args:
      replay_node: program client of the replay node (its `address()`).
      address: the address to connect to; None asks `replay_node`.
    """

    def __init__(self, replay_node: Any, address: str | None = None):
        self._replay_node = replay_node
        super().__init__(address or replay_node.address())

    def current_address(self) -> str:
        """Where the replay node serves now (blocks while it is being restarted)."""
        return self._replay_node.address()

    def at(self, address: str) -> "ReplayClient":
        """A client of the same replay node at `address`."""
        return ReplayClient(self._replay_node, address)


# What a sampler meets when the replay server goes away (a replay restart):
# worth sampling again after a pause, unlike a decode error.
CONNECTION_ERRORS = (tf.errors.UnavailableError, tf.errors.DeadlineExceededError)


class Batch(NamedTuple):
    """A sampled batch: item keys stay on the host; data goes to the devices."""

    keys: np.ndarray  # [B] uint64
    probabilities: np.ndarray  # [B] float64, the sampling probability of each item
    table_size: np.ndarray  # [B] int64
    data: types.PyTree  # [B, ...]
    # [B] int32 the replay shard that holds each item (gorila_jax/sharded_replay.py);
    # None: every item is on the one replay there is.
    shards: np.ndarray | None = None
    # [B] int32 the actor that wrote each item (`ItemCodec.sources`); None: items not packed.
    sources: np.ndarray | None = None


class SampledKeys(NamedTuple):
    """Item keys of a sampled batch, with the shard that owns each and the actor that wrote each.

    What the learner hands back with new priorities, so that `PriorityUpdater`
    sends each one to its item's shard, and what it counts each actor's
    sampled rows by (gorila_jax/balance.py). `row_keys` gives plain key arrays
    when there is neither.
    """

    keys: np.ndarray  # [B] uint64
    shards: np.ndarray | None = None  # [B] int32; None: one replay
    sources: np.ndarray | None = None  # [B] int32 source actors; None: unknown

    @property
    def size(self) -> int:
        """Rows, as for a key array."""
        return self.keys.size


def row_keys(batch: Batch, with_sources: bool = False) -> np.ndarray | SampledKeys:
    """What identifies the batch's items for a priority update: their keys, their shards
    when the replay is sharded and, `with_sources`, the actor that wrote each item."""
    sources = batch.sources if with_sources else None
    if batch.shards is None and sources is None:
        return batch.keys
    return SampledKeys(batch.keys, batch.shards, sources)


def batches(
    server_address: str,
    table: str,
    batch_size: int,
    codec: ItemCodec | None = None,
    prefetch: int = 4,
    rate_limiter_timeout_ms: int = 1000,
    num_workers: int = 2,
) -> Iterator[Batch]:
    """Batches from Reverb's tf.data dataset, prefetched in TensorFlow's threads.

    The iterator ends when the rate limiter holds samples back longer than
    `rate_limiter_timeout_ms`, so that a stopping learner is never stuck in it;
    the caller builds a new one if it wants to go on. `num_workers` sampling
    streams per iterator: Reverb's automatic choice gave about 37k CartPole
    items/s on 2 cores, two streams about 48k (bench/learner_throughput.py).
    """
    samples = sample_stream(
        server_address, table, batch_size, prefetch, rate_limiter_timeout_ms, num_workers
    )
    for sample in samples:
        yield Batch(
            keys=sample.info.key,
            probabilities=sample.info.probability,
            table_size=sample.info.table_size,
            data=sample.data if codec is None else codec.decode(sample.data, table),
            sources=None if codec is None else codec.sources(sample.data, table),
        )


def sample_stream(
    server_address: str,
    table: str,
    batch_size: int,
    prefetch: int = 4,
    rate_limiter_timeout_ms: int = 1000,
    num_workers: int = 2,
) -> Iterator[Any]:
    """Reverb's samples of `table` in batches of `batch_size` (numpy `ReplaySample`s, packed
    items undecoded), prefetched in TensorFlow's threads; see `batches` for the settings."""
    dataset = reverb.TrajectoryDataset.from_table_signature(
        server_address,
        table,
        max_in_flight_samples_per_worker=2 * batch_size,
        num_workers_per_iterator=num_workers,
        rate_limiter_timeout_ms=rate_limiter_timeout_ms,
    )
    dataset = dataset.batch(batch_size, drop_remainder=True).prefetch(prefetch)
    return dataset.as_numpy_iterator()


class PriorityUpdater:
    """Sends new priorities to Reverb from a thread, so the learner never waits on it.

    `submit` takes priorities that may still be computing on a device; the
    thread does the device->host copy, so the learner can dispatch its next
    update at once. A bounded queue keeps memory flat if Reverb falls behind.
    With a sharded replay each item's priority goes to the shard that holds
    it (`SampledKeys`), in one call per shard.

    Args:
      clients: a Reverb client of the replay, or one per shard, in shard order.
        A `ReplayClient` whose update fails asks its node where it serves now,
        so that the next updates reach a shard restarted elsewhere.
      table: the table the keys were sampled from.
    """

    def __init__(
        self, clients: reverb.Client | Sequence[reverb.Client], table: str, max_queued: int = 8
    ):
        self._clients = list(clients) if isinstance(clients, (list, tuple)) else [clients]
        self._table = table
        self._queue: queue.Queue = queue.Queue(max_queued)
        self.updates_sent = 0  # mutate calls that succeeded (one per shard a batch touches)
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="priority-updater", daemon=True)
        self._thread.start()

    def submit(
        self,
        keys: np.ndarray | SampledKeys,
        priorities: Any,
        scale: np.ndarray | None = None,
    ) -> None:
        """Queues new priorities for the sampled items `keys` (a key array: a single replay).

        Args:
          keys: the items, as `row_keys` gives them.
          priorities: [B] new priorities, possibly still computing on a device.
          scale: [B] host factors the priorities are multiplied by once they
            are on the host (a dominant actor's items: `balance.SampledRows`).
        """
        self._queue.put((keys, priorities, scale))

    def _loop(self) -> None:
        while (work := self._queue.get()) is not None:
            try:
                self._update(*work)
            except Exception:  # noqa: BLE001  the thread must live on: `close` waits for it
                logging.exception("priority update to table %s failed", self._table)

    def _update(self, keys: np.ndarray | SampledKeys, priorities: Any, scale: Any) -> None:
        shards = None
        if isinstance(keys, SampledKeys):
            keys, shards = keys.keys, keys.shards
            shards = None if shards is None else shards.reshape(-1)
        priorities = np.asarray(priorities, np.float64).reshape(-1)
        if scale is not None:
            priorities = priorities * np.asarray(scale, np.float64).reshape(-1)
        keys = keys.reshape(-1)
        finite = np.isfinite(priorities)
        if not finite.all():  # a skipped (non-finite) update: the items keep their old ones
            keys, priorities = keys[finite], priorities[finite]
            shards = None if shards is None else shards[finite]
        if shards is None:
            self._send(0, keys, priorities)
            return
        for shard in np.unique(shards).tolist():
            owned = shards == shard
            self._send(shard, keys[owned], priorities[owned])

    def _send(self, shard: int, keys: np.ndarray, priorities: np.ndarray) -> None:
        if not keys.size:
            return
        client = self._clients[shard]
        try:
            client.mutate_priorities(
                self._table, updates=dict(zip(keys.tolist(), priorities.tolist()))
            )
            self.updates_sent += 1
        except Exception:  # noqa: BLE001  a lost update only leaves old priorities
            logging.exception("priority update to table %s (shard %d) failed", self._table, shard)
            if isinstance(client, ReplayClient):
                try:
                    self._clients[shard] = client.at(client.current_address())
                except Exception:  # noqa: BLE001  the node is unreachable too: retry next time
                    logging.exception("replay shard %d: no current address", shard)

    def close(self, timeout_s: float = 30.0) -> None:
        """Sends what is queued, then ends the thread and waits for it (once; later calls
        return at once).

        Call it before the replay's servers stop: a thread still inside
        `mutate_priorities` then, or when the interpreter finalizes, can
        abort the process (see `learner.DevicePrefetcher.close`).
        """
        if self._closed:
            return
        self._closed = True
        self._queue.put(None)  # the thread lives until it takes this (see `_loop`)
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            logging.warning(
                "priority updates to table %s still running after %.0fs", self._table, timeout_s
            )
