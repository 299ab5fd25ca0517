"""Replay: the narrow interface actors and learners use, over Reverb.

Server address, items with priorities, batches with keys and probabilities,
priority updates; one server or K shards sampled as one replay. Code outside
this package imports `gorila_jax.replay` only, never its modules, so that
another backend (a tiered store, for example) can sit behind these names.
"""

from gorila_jax.replay.cold import COMPRESSIONS as COLD_COMPRESSIONS
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
from gorila_jax.replay.sampling import (
    CONNECTION_ERRORS,
    Batch,
    PriorityUpdater,
    SampledKeys,
    batches,
    row_keys,
    sample_stream,
)
from gorila_jax.replay.server import (
    CHECKPOINT_MANIFEST,
    NEWEST,
    CheckpointDamaged,
    IncompatibleCheckpoint,
    PortInUse,
    ReplayClient,
    ReplayNode,
    check_checkpoint,
    newest_intact_checkpoint,
)
from gorila_jax.replay.sharded import (
    ReplayShards,
    ShardedSampler,
    actor_shard,
    assigned_shard,
    shard_tables,
)
from gorila_jax.replay.tiers import COLD_CHECKPOINT, TierMetrics, Tiering, spill_table
from gorila_jax.replay.tables import prioritized_table, queue_table, rate_limiter, uniform_table
from gorila_jax.replay.writers import (
    NStepAccumulator,
    NStepAdder,
    Stopped,
    TrajectoryAdder,
    TransitionWriter,
    trajectory_example,
)

__all__ = [
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
