"""What a tiered replay (`--config.hot_replay_size`, docs/tiered_replay.md) costs and saves.

For DQN's items of the given env, in this one run, against an in-memory
replay of the same capacity filled with the same items: inserts/s through
the actors' writer (each item also enters the spill queue, and the replay
node's mover writes the evicted ones to disk), sampled rows/s through the
learners' sampler (both tiers, by priority mass), and how much the process's
anonymous resident memory (not the page cache of the memory-mapped cold tier) grew while each
was filled (the tiered one first, so that
memory it freed cannot hide the other's growth). Last line: JSON.

  python bench/tiered_replay.py --env=CartPole-v1
  python bench/tiered_replay.py --env=Pong-v5 --items=20000 --hot=2000
"""

import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import reverb  # noqa: E402
from absl import app, flags  # noqa: E402

from agents import dqn  # noqa: E402
from gorila_jax import envs, replay  # noqa: E402

flags.DEFINE_string("env", "CartPole-v1", "env whose DQN items fill the replay")
flags.DEFINE_integer("items", 50_000, "items written (the replay's capacity)")
flags.DEFINE_integer("hot", 10_000, "items the tiered replay keeps in memory")
flags.DEFINE_integer("batch_size", 256, "rows per sampled batch")
flags.DEFINE_float("seconds", 5.0, "time spent sampling each replay")
FLAGS = flags.FLAGS
TABLE = "priority_table"


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
        limiter = reverb.rate_limiters.MinSize(1)
        return [replay.prioritized_table(TABLE, FLAGS.items, 0.6, limiter, codec.signature())]

    anonymous = _anonymous_bytes()
    node = replay.ReplayNode(tables, tiering=tiering)
    writer = replay.TransitionWriter(reverb.Client(node.address()), TABLE)
    try:
        start = time.perf_counter()
        for first in range(0, len(packed), 1000):
            rows = packed[first : first + 1000]
            writer.write(rows, np.ones(len(rows)))
        writer.flush()
        if tiering is not None:  # inserted means in one of the tiers
            while node.tier_info()["cold_items"] < FLAGS.items - FLAGS.hot:
                time.sleep(0.01)
        inserts = len(packed) / (time.perf_counter() - start)
        grown = _anonymous_bytes() - anonymous
        sampler = replay.ReplayShards(node).sampler(TABLE, codec)
        rows, start = 0, time.perf_counter()
        try:
            batches = sampler.batches(FLAGS.batch_size)
            while time.perf_counter() - start < FLAGS.seconds:
                rows += len(next(batches).keys)
            samples = rows / (time.perf_counter() - start)
        finally:
            sampler.close()
    finally:
        writer.close()
        node.close()
    return {"inserts_per_s": inserts, "rows_per_s": samples, "rss_growth_mb": grown / 2**20}


def main(_):
    spec = envs.env_spec(FLAGS.env)
    codec = dqn.DQNBuilder(dqn.DQNConfig()).item_codec(spec)
    rng = np.random.default_rng(0)
    packed = rng.integers(0, 256, (FLAGS.items, codec.num_bytes), dtype=np.uint8)
    with tempfile.TemporaryDirectory() as cold_dir:
        tiering = replay.Tiering(TABLE, FLAGS.hot, FLAGS.items - FLAGS.hot, cold_dir)
        tiered = _fill_and_sample(codec, packed, tiering)
    in_memory = _fill_and_sample(codec, packed, None)
    result = {
        "env": FLAGS.env,
        "item_bytes": codec.num_bytes,
        "items": FLAGS.items,
        "hot": FLAGS.hot,
        **{f"tiered_{k}": round(v, 1) for k, v in tiered.items()},
        **{f"in_memory_{k}": round(v, 1) for k, v in in_memory.items()},
        "inserts_vs_in_memory": round(tiered["inserts_per_s"] / in_memory["inserts_per_s"], 3),
        "rows_vs_in_memory": round(tiered["rows_per_s"] / in_memory["rows_per_s"], 3),
    }
    print(
        f"{FLAGS.env}: {codec.num_bytes} bytes/item, {FLAGS.items:,} items, {FLAGS.hot:,} hot; "
        f"inserts/s {tiered['inserts_per_s']:,.0f} tiered vs {in_memory['inserts_per_s']:,.0f} "
        f"({result['inserts_vs_in_memory']}x); sampled rows/s {tiered['rows_per_s']:,.0f} vs "
        f"{in_memory['rows_per_s']:,.0f} ({result['rows_vs_in_memory']}x); memory grown "
        f"{tiered['rss_growth_mb']:,.0f} MB vs {in_memory['rss_growth_mb']:,.0f} MB"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    app.run(main)
