"""What a tiered replay (`--config.hot_replay_size`, docs/tiered_replay.md) costs and saves.

For DQN's items of the given env, in this one run, a tiered replay and an
in-memory one of the same capacity, filled with the same items:
- inserts/s through the actors' writer (each item also enters the spill
  queue, and the replay node's mover writes the evicted ones to disk);
- sampled rows/s through the learners' sampler: the hot tier alone, the cold
  tier alone, both by priority mass, and the in-memory replay (plain Reverb);
- how much the process's anonymous resident memory grew while each was
  filled (not the page cache of the memory-mapped cold tier; the tiered one
  first, so that memory it freed cannot hide the other's growth), and how
  much of it the second half of the items added, per item;
- from those, the largest replay each holds within `--memory_budget_gb`
  (the tiered one also within the cold directory's free disk, at the bytes
  a cold item took there: `--compression=zlib` packs image items).
Last line: JSON.

  python bench/tiered_replay.py --env=CartPole-v1
  python bench/tiered_replay.py --env=Pong-v5 --items=20000 --hot=2000 --compression=zlib
"""

import json
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import reverb  # noqa: E402
from absl import app, flags  # noqa: E402

from agents import dqn  # noqa: E402
from gorila_jax import envs, replay, types  # noqa: E402

flags.DEFINE_string("env", "CartPole-v1", "env whose DQN items fill the replay")
flags.DEFINE_integer("items", 50_000, "items written (the replay's capacity)")
flags.DEFINE_integer("hot", 10_000, "items the tiered replay keeps in memory")
flags.DEFINE_integer("batch_size", 256, "rows per sampled batch")
flags.DEFINE_float("seconds", 4.0, "time spent on each sampling measurement")
flags.DEFINE_float("memory_budget_gb", 16.0, "memory a replay may take, for the capacity estimate")
flags.DEFINE_enum("compression", "none", replay.COLD_COMPRESSIONS, "how cold items are stored")
FLAGS = flags.FLAGS
TABLE = "priority_table"


def _env_items(spec, codec: replay.ItemCodec, count: int) -> np.ndarray:
    """`count` packed transitions of a uniform random policy in the env: real observations,
    which Reverb's chunk compression treats as it would in a run (random bytes would not
    compress at all)."""
    num_envs = 8
    env = envs.make_env(FLAGS.env, num_envs, seed=0)
    rng = np.random.default_rng(0)
    observation, _ = env.reset()
    parts, made = [], 0
    while made < count:
        action = envs.uniform_random_actions(spec, rng, num_envs)
        following, reward, terminated, _, _ = env.step(action)
        transition = types.Transition(
            observation,
            action.astype(np.int32),
            reward.astype(np.float32),
            np.where(terminated, 0.0, 0.99).astype(np.float32),
            following,
        )
        parts.append(codec.encode(transition, source=0))
        made += num_envs
        observation = following
    env.close()
    return np.concatenate(parts)[:count]


def _anonymous_bytes() -> int:
    """This process's resident memory less file pages: the cold tier's memory-mapped items
    are page cache that the kernel writes back and drops under pressure, not the replay's
    own memory."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no RssAnon in /proc/self/status (Linux only)")


def _fill_and_sample(codec: replay.ItemCodec, packed: np.ndarray, tiering) -> dict:
    def tables():
        limiter = replay.RateLimit(1)
        return [replay.prioritized_table(TABLE, FLAGS.items, 0.6, limiter, codec.num_bytes)]

    def written(count: int) -> int:
        """Anonymous memory once `count` items are in (in one of the tiers, when tiered)."""
        if tiering is not None:
            while node.tier_info()["cold_items"] < count - FLAGS.hot:
                time.sleep(0.01)
        return _anonymous_bytes()

    anonymous = _anonymous_bytes()
    node = replay.ReplayNode(tables, tiering=tiering)
    writer = replay.TransitionWriter(reverb.Client(node.address()), TABLE)
    half = len(packed) // 2
    try:
        start = time.perf_counter()
        for first in range(0, len(packed), 1000):
            rows = packed[first : first + 1000]
            writer.write(rows, np.ones(len(rows)))
            if first < half <= first + len(rows):  # the measure at "half" may be a bit past it
                writer.flush()
                at_half = written(half)
        writer.flush()
        at_full = written(len(packed))
        inserts = len(packed) / (time.perf_counter() - start)
        found = {
            "inserts_per_s": inserts,
            "memory_growth_mb": (at_full - anonymous) / 2**20,
            # The second half's growth per item: what one more item costs, without the
            # buffers and threads that the first items paid for once.
            "memory_per_item_b": (at_full - at_half) / (len(packed) - half),
        }
        if tiering is not None:
            found["cold_bytes_per_item"] = node.tier_info()["cold_bytes"] / tiering.cold_size
        found["rows_per_s"] = _rows_per_s(replay.ReplayShards(node).sampler(TABLE, codec))
        if tiering is not None:
            found["hot_rows_per_s"] = _rows_per_s(replay.ShardedSampler([node], TABLE, codec))
            cold_only = replay.ShardedSampler([], TABLE, codec, cold_nodes=[node])
            found["cold_rows_per_s"] = _rows_per_s(cold_only)
    finally:
        writer.close()
        node.close()
    return found


def _rows_per_s(sampler) -> float:
    rows, start = 0, time.perf_counter()
    try:
        batches = sampler.batches(FLAGS.batch_size)
        while time.perf_counter() - start < FLAGS.seconds:
            rows += len(next(batches).keys)
        return rows / (time.perf_counter() - start)
    finally:
        sampler.close()


def main(_):
    spec = envs.env_spec(FLAGS.env)
    codec = dqn.DQNBuilder(dqn.DQNConfig()).replay_layout(spec).codec
    packed = _env_items(spec, codec, FLAGS.items)
    with tempfile.TemporaryDirectory() as cold_dir:
        tiering = replay.Tiering(
            TABLE, FLAGS.hot, FLAGS.items - FLAGS.hot, cold_dir, cold_compression=FLAGS.compression
        )
        tiered = _fill_and_sample(codec, packed, tiering)
        disk_free = shutil.disk_usage(cold_dir).free
    in_memory = _fill_and_sample(codec, packed, None)
    # Memory per item: every item in memory, or a hot item plus what a cold one keeps in RAM.
    budget = FLAGS.memory_budget_gb * 2**30
    per_item = max(in_memory["memory_per_item_b"], 1.0)
    per_cold_item = max(tiered["memory_per_item_b"], 1.0)
    largest_in_memory = int(budget / per_item)
    room = max(budget - FLAGS.hot * per_item, 0)
    largest_tiered = FLAGS.hot + int(
        min(room / per_cold_item, disk_free / tiered["cold_bytes_per_item"])
    )
    result = {
        "env": FLAGS.env,
        "item_bytes": codec.num_bytes,
        "compression": FLAGS.compression,
        "items": FLAGS.items,
        "hot": FLAGS.hot,
        **{f"tiered_{k}": round(v, 1) for k, v in tiered.items()},
        **{f"in_memory_{k}": round(v, 1) for k, v in in_memory.items()},
        "inserts_vs_in_memory": round(tiered["inserts_per_s"] / in_memory["inserts_per_s"], 3),
        "rows_vs_in_memory": round(tiered["rows_per_s"] / in_memory["rows_per_s"], 3),
        "hot_rows_vs_in_memory": round(tiered["hot_rows_per_s"] / in_memory["rows_per_s"], 3),
        "cold_rows_vs_in_memory": round(tiered["cold_rows_per_s"] / in_memory["rows_per_s"], 3),
        "memory_budget_gb": FLAGS.memory_budget_gb,
        "largest_in_memory_items": largest_in_memory,
        "largest_tiered_items": largest_tiered,
    }
    print(
        f"{FLAGS.env}: {codec.num_bytes} bytes/item ({tiered['cold_bytes_per_item']:,.0f} on "
        f"disk, {FLAGS.compression}), {FLAGS.items:,} items, {FLAGS.hot:,} hot; "
        f"inserts/s {tiered['inserts_per_s']:,.0f} tiered vs {in_memory['inserts_per_s']:,.0f} "
        f"({result['inserts_vs_in_memory']}x); sampled rows/s {tiered['rows_per_s']:,.0f} vs "
        f"{in_memory['rows_per_s']:,.0f} ({result['rows_vs_in_memory']}x; hot alone "
        f"{result['hot_rows_vs_in_memory']}x, cold alone {result['cold_rows_vs_in_memory']}x); "
        f"memory grown {tiered['memory_growth_mb']:,.0f} MB vs "
        f"{in_memory['memory_growth_mb']:,.0f} MB, of which per item "
        f"{tiered['memory_per_item_b']:,.0f} B vs {in_memory['memory_per_item_b']:,.0f} B; "
        f"in {FLAGS.memory_budget_gb:g} GB: "
        f"{largest_tiered:,} items tiered vs {largest_in_memory:,} in memory"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    app.run(main)
