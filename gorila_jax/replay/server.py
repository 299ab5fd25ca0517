"""The Reverb backend's replay node: a Reverb server with checkpoints, and the client that
follows it."""

import logging
import os
import shutil
from typing import Any, Callable, Sequence

import reverb
import tensorflow as tf
from reverb.cc.checkpointing import checkpoint_pb2

from gorila_jax.replay import api, codec, manifest, reverb_tables, reverb_writer, serving, tiers
from gorila_jax.replay import tiering as tiering_lib
from gorila_jax.replay.manifest import IncompatibleCheckpoint


def _lacks_source_trailer(held: Any, configured: Any) -> bool:
    """Whether `held` is `configured` (packed items) less the source-actor trailer."""
    packed = [
        isinstance(spec, tf.TensorSpec) and spec.dtype == tf.uint8 and spec.shape.rank == 1
        for spec in (held, configured)
    ]
    return all(packed) and held.shape[0] + codec.SOURCE_BYTES == configured.shape[0]


class ReplayNode:
    """Hosts a Reverb server with the tables an agent's builder declares.

    Reverb's server listens on every interface of its host (gRPC on
    `[::]:port`, without authentication: Reverb has no option for either);
    keep the replay port closed to untrusted networks (README, multi-host).

    Args:
      make_tables: returns the agent's tables (`api.TableSpec`s).
      port: the server's port; None picks a free one. The experiment picks
        one for the whole run, so that a restarted replay node serves at the
        same address and Reverb's clients (writers, samplers) reconnect to it.
      any_port_if_taken: serve on a free port instead when `port` is taken.
        For a port the experiment picked itself: between the pick and the
        bind (a minute on a loaded host) the kernel may hand it to another
        process's connection. Clients find a node serving at another address
        (`ReplayClient`), as after a restart elsewhere. A port the user chose
        (`--replay_port`) is never swapped: it fails with PortInUse.
      checkpoint_dir: where `checkpoint` writes (`<logdir>/checkpoints/replay`,
        absolute); None: no checkpoints.
      restore_step: start from the checkpoint taken at this learner step;
        `NEWEST`: from the newest intact one (an empty replay if there is none),
        as a replay node restarted after a crash does.
      preload: called with a connection to the server once it serves (after any
        restore), to write what the run starts with (demonstrations,
        `gorila_jax.demonstrations.Loader`, which skips a table a restored
        checkpoint already filled).
      tiering: keep the sampled table's older items in a cold tier on disk
        (`tiering.Tiering`, gorila_jax/replay/tiers.py); None: all in memory.

    Raises:
      PortInUse: `port` is taken by another process.
    """

    def __init__(
        self,
        make_tables: Callable[[], Sequence[api.TableSpec]],
        port: int | None = None,
        checkpoint_dir: str | None = None,
        restore_step: int | None = None,
        any_port_if_taken: bool = False,
        preload: Callable[[api.Connection], Any] | None = None,
        tiering: tiering_lib.Tiering | None = None,
    ):
        self._checkpoint_dir = checkpoint_dir
        self._tiers: tiers.TierMover | None = None
        restore_step, restore_path, expected_sizes = _restore_point(
            checkpoint_dir, restore_step, tiering
        )
        checkpointer = None
        if checkpoint_dir is not None:
            checkpointer = _checkpointer(checkpoint_dir, restore_path)
        specs = list(make_tables())
        if tiering is not None:
            tiering.sampled_spec(specs)  # raises for a table that cannot be tiered
        agent_tables = [reverb_tables.make_table(spec) for spec in specs]
        tables = agent_tables if tiering is None else tiers.reverb_tables(tiering, agent_tables)
        signatures = {table.info.name: table.info.signature for table in tables}
        self._server = serving.start_server(tables, port, any_port_if_taken, checkpointer)
        self._host = serving.reachable_host()
        self._restored = {"step": restore_step, "table_sizes": expected_sizes or {}}
        if expected_sizes is not None:
            self._check_restored(expected_sizes, restore_step)
            self._check_signatures(signatures, restore_step)
            logging.warning(
                "replay: restored the checkpoint of learner step %d, tables %s",
                restore_step,
                expected_sizes,
            )
        try:
            if tiering is not None:
                self._tiers = tiers.TierMover(
                    self._server.localhost_client(),
                    tiering,
                    agent_tables,
                    restore_path if expected_sizes is not None else None,
                )
                self._restored["cold_items"] = self._tiers.restored_items
            if preload is not None:
                preload(reverb_writer.ReverbConnection(self._server.localhost_client()))
        except BaseException:
            self.close()
            raise

    def restored_from(self) -> dict[str, Any]:
        """{"step": the learner step of the checkpoint restored (None: started empty),
        "table_sizes": its table sizes, which the tables held right after the restore,
        and for a tiered replay "cold_items": what its cold tier held then}."""
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
                    f"version's items are {signature.shape[0]} bytes: a {codec.SOURCE_BYTES}-byte "
                    "source-actor trailer, gorila_jax/replay/codec.py ItemCodec); resume it "
                    "with the version that wrote it, or start the run afresh (a new logdir, or "
                    "without --resume)"
                )
            raise IncompatibleCheckpoint(
                f"replay checkpoint {path}: table {name!r} holds items {held}, this run's "
                f"agent writes {signature}: it is a checkpoint of another agent config or "
                "environment"
            )

    def address(self) -> str:
        """host:port that clients on any node of the cluster can reach."""
        return f"{self._host}:{self._server.port}"

    def endpoint(self) -> api.Endpoint:
        """Reverb's, at `address()`."""
        return api.Endpoint(api.REVERB, self.address())

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
        if self._tiers is None:
            written = self._server.localhost_client().checkpoint()
        else:
            with self._tiers.paused():  # each item in exactly one of spill and cold
                written = self._server.localhost_client().checkpoint()
                self._tiers.checkpoint(written)
        sizes = _write_manifest(written)
        final = os.path.join(self._checkpoint_dir, str(step))
        if os.path.exists(final):
            shutil.rmtree(final)
        os.rename(written, final)
        return {"path": final, "table_sizes": sizes}

    def keep_checkpoints(self, steps: Sequence[int]) -> None:
        """Deletes the checkpoints of every step not in `steps`."""
        manifest.keep_checkpoints(self._checkpoint_dir, steps)

    # ------------------------------------------------------------ a tiered replay's cold tier

    def cold_tier(self) -> dict[str, Any] | None:
        """{"table": the tiered table, "prioritized": whether its priorities matter}; None:
        not tiered."""
        if self._tiers is None:
            return None
        return {"table": self._tiers.table, "prioritized": self._tiers.exponent is not None}

    def cold_sample(self, count: int) -> tuple[Any, float, int]:
        """`tiers.TierMover.sample`: up to `count` cold rows, the cold mass and size."""
        return self._tiered().sample(count)

    def cold_update(self, keys: Any, priorities: Any) -> int:
        """New priorities of cold items by key; returns how many were still held."""
        return self._tiered().update(keys, priorities)

    def note_priorities(self, hashes: Any, priorities: Any) -> None:
        """New priorities of hot items by content hash (they move to the cold tier with them)."""
        self._tiered().note_priorities(hashes, priorities)

    def tier_info(self) -> dict[str, float]:
        """Items and bytes per tier, cold rows read, items moved (`tiers.TierMover.info`)."""
        return self._tiered().info()

    def _tiered(self) -> tiers.TierMover:
        if self._tiers is None:
            raise RuntimeError("this replay node has no cold tier (it was built without tiering)")
        return self._tiers

    def close(self) -> None:
        if self._tiers is not None:
            self._tiers.close()  # its mover samples the server: it ends first
        self._server.stop()


def _restore_point(
    checkpoint_dir: str | None, restore_step: int | None, tiering: tiering_lib.Tiering | None
) -> tuple[int | None, str | None, dict[str, int] | None]:
    """The checkpoint a replay starts from: (its step, its path, the table sizes it
    holds), or Nones for an empty replay (NEWEST without a checkpoint among them).

    Raises:
      ValueError: a step without a checkpoint_dir; a damaged checkpoint, or one of
        another backend or tiering (naming it).
    """
    if checkpoint_dir is None:
        if restore_step is not None and restore_step != manifest.NEWEST:
            raise ValueError("restore_step needs a checkpoint_dir")
        return None, None, None
    if restore_step == manifest.NEWEST:
        restore_step = manifest.newest_intact_checkpoint(checkpoint_dir)
    if restore_step is None:
        return None, None, None
    restore_path = os.path.join(checkpoint_dir, str(restore_step))
    expected_sizes = manifest.check_checkpoint(restore_path)
    manifest.check_backend(restore_path, api.REVERB)
    tiering_lib.check_tiers_match(restore_path, tiering)
    return restore_step, restore_path, expected_sizes


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


def _write_manifest(path: str) -> dict[str, int]:
    """Writes the manifest of the Reverb checkpoint at `path` (`manifest.write_manifest`);
    returns its table sizes.

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
    manifest.write_manifest(path, sizes, api.REVERB)
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
