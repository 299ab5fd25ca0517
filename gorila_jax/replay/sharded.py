"""Replay sharded over K replay nodes, sampled by learners as one prioritized replay.

Actor i writes to shard i % K (`assigned_shard`). A learner samples every
batch across all shards with its backend's sampler (`native_sampler.NativeSampler`,
Reverb's `reverb_sampler.ShardedSampler`): it splits the batch's rows over
the shards with a multinomial draw in proportion to each shard's priority
mass M_k (the sum of priority**alpha over its items; a uniform or FIFO
table's mass is its size), and rescales the within-shard probabilities
to global ones, p_i**alpha / sum_k M_k, so that agents' importance weights
are those of one replay holding every item. New priorities go back
to the shard that holds each item (`priority_updates.PriorityUpdater`).
"""

import threading
from typing import Any, Callable, Sequence


from gorila_jax.replay import api, backends, codec, mixing, native_node, native_sampler
from gorila_jax.replay import priority_updates


def assigned_shard(actor_index: int, num_shards: int) -> int:
    """The shard actor `actor_index` writes to: actors are dealt out over shards in turn."""
    return actor_index % num_shards


def actor_shard(replay_nodes: Any, actor_index: int) -> Any:
    """The replay node actor `actor_index` writes to: `replay_nodes` itself, or of a
    list of shards the one `assigned_shard` names."""
    if isinstance(replay_nodes, (list, tuple)):
        return replay_nodes[assigned_shard(actor_index, len(replay_nodes))]
    return replay_nodes


def shard_tables(
    make_tables: Callable[[], Sequence[api.TableSpec]], num_shards: int
) -> list[api.TableSpec]:
    """The agent's tables cut to the size of one of `num_shards` shards (`api.TableSpec.for_shard`:
    1/K of the capacity, the minimum size and the rate limiter's slack)."""
    return [table.for_shard(num_shards) for table in make_tables()]


class ReplayShards:
    """A run's replay shards as a learner uses them: one replay to sample, checkpoint and prune.

    Args:
      nodes: the client of the replay node, or of each shard in shard order.
    """

    def __init__(self, nodes: Any | Sequence[Any]):
        self.nodes = list(nodes) if isinstance(nodes, (list, tuple)) else [nodes]
        if not self.nodes:
            raise ValueError("a replay needs at least one shard")
        self._tiers: dict[int, dict[str, Any] | None] | None = None
        self._backend: str | None = None

    def __len__(self) -> int:
        return len(self.nodes)

    @property
    def backend(self) -> str:
        """The backend that serves the shards (`api.BACKENDS`), asked once."""
        if self._backend is None:
            self._backend = self.nodes[0].endpoint().backend
        return self._backend

    def sampler(
        self,
        table: str,
        codec: codec.ItemCodec | None,
        stop: threading.Event | None = None,
        content_hashes: bool = False,
        demo_fraction: float = 0.0,
    ) -> Any:
        """Batches of `table` across the shards; with `demo_fraction`, that share of every
        batch from the demonstration table on the first shard (`mixing.MixedSampler`)."""
        own = self._sampler(self.nodes, table, codec, stop, content_hashes, self.cold_tiers(table))
        if not demo_fraction:
            return own
        demos = self._sampler(self.nodes[:1], mixing.DEMO_TABLE, codec, stop, content_hashes, {})
        return mixing.MixedSampler(own, demos, demo_fraction)

    def _sampler(
        self,
        nodes: list[Any],
        table: str,
        codec: codec.ItemCodec | None,
        stop: threading.Event | None,
        content_hashes: bool,
        cold: dict[int, dict[str, Any]],
    ) -> Any:
        """The backend's sampler of `table` on `nodes` (`native_sampler.NativeSampler` or
        `reverb_sampler.ShardedSampler`), with `cold` (`cold_tiers`) sampled too."""
        if self.backend == api.NATIVE:
            return native_sampler.NativeSampler(
                nodes,
                table,
                codec,
                stop=stop,
                content_hashes=content_hashes,
                cold_shards=sorted(cold),
            )
        return backends.reverb_module("reverb_sampler").ShardedSampler(
            nodes,
            table,
            codec,
            stop=stop,
            content_hashes=content_hashes,
            cold_nodes=[self.nodes[shard] for shard in cold],
            # A tiered prioritized replay moves each hot item's newest priority with it, by
            # content (`ReplayNode.note_priorities`).
            hot_hashes=any(tier["prioritized"] for tier in cold.values()),
        )

    def cold_tiers(self, table: str) -> dict[int, dict[str, Any]]:
        """{shard: its cold tier (`ReplayNode.cold_tier`)} of the shards whose `table` is tiered,
        asked once per replay."""
        if self._tiers is None:
            self._tiers = {shard: node.cold_tier() for shard, node in enumerate(self.nodes)}
        return {
            shard: tier
            for shard, tier in self._tiers.items()
            if tier is not None and tier["table"] == table
        }

    def priority_updater(self, table: str) -> priority_updates.PriorityUpdater:
        """Sends priorities to the shard of each item, at the address each serves at now,
        and to the tier that holds it (streams K.. are the shards' cold tiers, as sampled)."""
        cold = self.cold_tiers(table)
        if self.backend == api.NATIVE:
            # A tiered shard's node routes each key to the tier that holds it.
            shards = list(self.nodes) + [self.nodes[shard] for shard in sorted(cold)]
            clients = [native_node.NativePriorities(node) for node in shards]
            return priority_updates.PriorityUpdater(clients, table)
        server = backends.reverb_module("server")
        tiers = backends.reverb_module("tiers")
        clients = [server.ReplayClient(node) for node in self.nodes]
        clients += [tiers.ColdPriorities(self.nodes[shard]) for shard in cold]
        noted = {shard: self.nodes[shard] for shard, tier in cold.items() if tier["prioritized"]}
        return priority_updates.PriorityUpdater(clients, table, hot_priorities=noted)

    def checkpoint(self, step: int) -> dict[str, Any]:
        """Checkpoints every shard as learner step `step`.

        Returns:
          The replay node's record (`ReplayNode.checkpoint`) for a single
          replay; with shards, the table sizes summed over them and each
          shard's record under "shards".
        """
        records = [node.checkpoint(step) for node in self.nodes]
        if len(records) == 1:
            return records[0]
        sizes: dict[str, int] = {}
        for record in records:
            for name, size in record["table_sizes"].items():
                sizes[name] = sizes.get(name, 0) + size
        return {"table_sizes": sizes, "shards": records}

    def keep_checkpoints(self, steps: Sequence[int]) -> None:
        for node in self.nodes:
            node.keep_checkpoints(steps)
