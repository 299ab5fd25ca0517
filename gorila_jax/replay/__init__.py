"""Replay: the narrow interface actors and learners use (`api`), over two backends.

Tables declared by agents, connections that write items with priorities,
batches with keys and probabilities, priority updates, checkpoints; one node
or K shards sampled as one replay. The native backend keeps tables in the
replay node's process (native_*.py); the Reverb backend serves them from a
Reverb server (`backends.REVERB_MODULES`). Only the DeepMind dependency set installs
Reverb, so its names here (`_REVERB_NAMES`) are imported on first use, and importing
this package never imports reverb or tensorflow.
Code outside this package imports `gorila_jax.replay` only, never its modules.
"""

from typing import Any


from gorila_jax.replay.api import (
    BACKENDS,
    KINDS,
    NATIVE,
    PRIORITIZED,
    QUEUE,
    REVERB,
    UNIFORM,
    Batch,
    Connection,
    RateLimit,
    SampledKeys,
    Stopped,
    TableSpec,
    row_keys,
)
from gorila_jax.replay.backends import (
    DEFAULT_BACKEND,
    REVERB_MODULES,
    BackendMissing,
    check_table_sizes,
    connect,
    installed,
    node_class,
    require,
    reverb_module,
)
from gorila_jax.replay.cold_ring import COMPRESSIONS as COLD_COMPRESSIONS
from gorila_jax.replay.cold import ColdRows, ColdStore
from gorila_jax.replay.codec import SOURCE_BYTES, UNKNOWN_SOURCE, ItemCodec, transition_codec
from gorila_jax.replay.compact import STORAGE_DTYPES, CompactFloats, observation_storage
from gorila_jax.replay.duplicates import DuplicateCounter
from gorila_jax.replay.mixing import (
    DEMO_SOURCE,
    DEMO_TABLE,
    MixedSampler,
    demo_rows,
    demo_table,
)
from gorila_jax.replay.manifest import (
    CHECKPOINT_MANIFEST,
    NEWEST,
    CheckpointDamaged,
    IncompatibleCheckpoint,
    check_backend,
    check_checkpoint,
    checkpoint_backend,
    newest_intact_checkpoint,
)
from gorila_jax.replay.native_node import NativeReplayNode, check_memory, node_specs
from gorila_jax.replay.priority_updates import PriorityUpdater
from gorila_jax.replay.sharded import (
    ReplayShards,
    actor_shard,
    assigned_shard,
    shard_tables,
)
from gorila_jax.replay.tiering import COLD_CHECKPOINT, TierMetrics, Tiering, spill_table
from gorila_jax.replay.tables import prioritized_table, queue_table, rate_limiter, uniform_table
from gorila_jax.replay.writers import (
    NStep,
    NStepAccumulator,
    NStepAdder,
    TrajectoryAdder,
    trajectory_example,
)

__all__ = [
    "check_memory",
    "check_table_sizes",
    "node_specs",
    "REVERB_MODULES",
    "installed",
    "DEFAULT_BACKEND",
    "require",
    "BackendMissing",
    "reverb_module",
    "BACKENDS",
    "KINDS",
    "NATIVE",
    "PRIORITIZED",
    "QUEUE",
    "REVERB",
    "UNIFORM",
    "Connection",
    "NativeReplayNode",
    "RateLimit",
    "ReverbConnection",
    "TableSpec",
    "check_backend",
    "checkpoint_backend",
    "connect",
    "node_class",
    "reverb_table",
    "CHECKPOINT_MANIFEST",
    "COLD_CHECKPOINT",
    "COLD_COMPRESSIONS",
    "CONNECTION_ERRORS",
    "DEMO_SOURCE",
    "DEMO_TABLE",
    "NEWEST",
    "SOURCE_BYTES",
    "STORAGE_DTYPES",
    "UNKNOWN_SOURCE",
    "Batch",
    "CheckpointDamaged",
    "ColdRows",
    "ColdStore",
    "CompactFloats",
    "DuplicateCounter",
    "IncompatibleCheckpoint",
    "MixedSampler",
    "ItemCodec",
    "NStepAccumulator",
    "NStep",
    "NStepAdder",
    "PortInUse",
    "PriorityUpdater",
    "ReplayClient",
    "ReplayNode",
    "ReplayShards",
    "SampledKeys",
    "ShardedSampler",
    "Stopped",
    "TierMetrics",
    "Tiering",
    "TrajectoryAdder",
    "TransitionWriter",
    "actor_shard",
    "assigned_shard",
    "batches",
    "check_checkpoint",
    "demo_rows",
    "demo_table",
    "newest_intact_checkpoint",
    "observation_storage",
    "prioritized_table",
    "queue_table",
    "rate_limiter",
    "row_keys",
    "sample_stream",
    "shard_tables",
    "spill_table",
    "trajectory_example",
    "transition_codec",
    "uniform_table",
]

# The Reverb backend's names: {name: (its module, the name there)}.
_REVERB_NAMES = {
    "CONNECTION_ERRORS": ("sampling", "CONNECTION_ERRORS"),
    "PortInUse": ("serving", "PortInUse"),
    "ReplayClient": ("server", "ReplayClient"),
    "ReplayNode": ("server", "ReplayNode"),
    "ReverbConnection": ("reverb_writer", "ReverbConnection"),
    "ShardedSampler": ("reverb_sampler", "ShardedSampler"),
    "TransitionWriter": ("reverb_writer", "TransitionWriter"),
    "batches": ("sampling", "batches"),
    "reverb_table": ("reverb_tables", "make_table"),
    "sample_stream": ("sampling", "sample_stream"),
}


def __getattr__(name: str) -> Any:
    """A name of the Reverb backend, imported on first use (`backends.BackendMissing`
    without dm-reverb)."""
    if name not in _REVERB_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attribute = _REVERB_NAMES[name]
    return getattr(reverb_module(module), attribute)
