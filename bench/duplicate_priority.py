"""What duplicate-aware priorities (`--config.priority_duplicate_bonus`) cost the learner host.

For DQN's items of the given env, in this one run: rows/s of the content
hash (`ItemCodec.content_hashes`) and of the duplicate count
(`replay.DuplicateCounter.bonus`), each as a ratio to rows/s of decoding the
same packed batch (`ItemCodec.decode`), which the sampler does for every
batch anyway. Last line: JSON.

  python bench/duplicate_priority.py --env=CartPole-v1
  python bench/duplicate_priority.py --env=Pong-v5
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

from agents import dqn  # noqa: E402
from bench import timing  # noqa: E402
from gorila_jax import envs, replay  # noqa: E402

flags.DEFINE_string("env", "CartPole-v1", "env whose DQN items are hashed")
flags.DEFINE_integer("batch_size", 256, "rows per batch")
flags.DEFINE_float("seconds", 3.0, "time per measurement")
FLAGS = flags.FLAGS


def main(_):
    spec = envs.env_spec(FLAGS.env)
    codec = dqn.DQNBuilder(dqn.DQNConfig()).replay_layout(spec).codec
    rows = FLAGS.batch_size
    rng = np.random.default_rng(0)
    packed = rng.integers(0, 256, (rows, codec.num_bytes), dtype=np.uint8)
    packed[:, codec.payload_bytes :] = 0  # every row from actor 0
    hashes = codec.content_hashes(packed)
    counter = replay.DuplicateCounter(bonus=1.0, capacity=1_000_000)
    sources = codec.sources(packed)
    decode = timing.timed(lambda: codec.decode(packed), FLAGS.seconds, rows)
    content_hashes = timing.timed(lambda: codec.content_hashes(packed), FLAGS.seconds, rows)
    count = timing.timed(lambda: counter.bonus(hashes, sources), FLAGS.seconds, rows)
    result = {
        "env": FLAGS.env,
        "item_bytes": codec.num_bytes,
        "decode_rows_per_s": round(decode),
        "hash_rows_per_s": round(content_hashes),
        "count_rows_per_s": round(count),
        "hash_vs_decode": round(content_hashes / decode, 3),
        "count_vs_decode": round(count / decode, 3),
    }
    print(
        f"{FLAGS.env}: {codec.num_bytes} bytes/item; rows/s decode {decode:,.0f}, "
        f"hash {content_hashes:,.0f} ({result['hash_vs_decode']}x), "
        f"count {count:,.0f} ({result['count_vs_decode']}x)"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    app.run(main)
