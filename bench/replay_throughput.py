"""Replay throughput, native against Reverb in the same run: items inserted and sampled per
second, for CartPole- and Atari-sized DQN items, batch 64 and 256, 1 and 4 shards, with the
replay in this process and on Ray (a Ray actor per shard, as under --launcher=ray).

  python bench/replay_throughput.py
  python bench/replay_throughput.py --seconds=2 --places=process

Inserts go as an actor writes them (the agent's n-step items of 8 envs a step, one writer
per shard); sampling as a learner samples (`replay.ReplayShards.sampler`, the learner's
batches decoded by the agent's codec, 8 updates' rows at once as the cartpole preset's
`updates_per_dispatch`). Tables are the DQN builder's (prioritized, alpha 0.6), the rate
limiter relaxed to the minimum size, so each rate is the replay's own. The last line is JSON:
every figure, and native / Reverb ratios. Each backend this set installs is measured: the
default set has the native replay alone; the DeepMind set (no Ray) has both, in-process:

  .venv-deepmind/bin/python bench/replay_throughput.py --places=process
"""

import dataclasses
import functools
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

from agents import dqn  # noqa: E402
from gorila_jax import envs, replay, types  # noqa: E402
from gorila_jax.distributed import launchers  # noqa: E402
from gorila_jax.distributed import program as program_lib  # noqa: E402

_SECONDS = flags.DEFINE_float("seconds", 2.0, "Seconds per measurement.")
_PLACES = flags.DEFINE_list("places", ["process", "ray"], "Where the replay runs.")
_ENVS = flags.DEFINE_list("envs", ["CartPole-v1", "Pong-v5"], "Item sizes: these envs' items.")
_BATCHES = flags.DEFINE_list("batch_sizes", ["64", "256"], "Learner batch sizes.")
_SHARDS = flags.DEFINE_list("shards", ["1", "4"], "Replay shards.")

ENVS_PER_ACTOR = 8
UPDATES_PER_SAMPLE = 8
CAPACITY_BYTES = 400 * 2**20  # per table: Atari items fit ~7k


def _tables(builder, spec, num_shards: int) -> list[replay.TableSpec]:
    (table,) = builder.replay_layout(spec).tables
    table = dataclasses.replace(table, rate_limit=replay.RateLimit(1))
    return [table.for_shard(num_shards)]


def _items(codec, spec, count: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if spec.observation_dtype == "uint8":
        obs = rng.integers(0, 255, (count, *spec.observation_shape), np.uint8)
    else:
        obs = rng.normal(size=(count, *spec.observation_shape)).astype(np.float32)
    transitions = types.Transition(
        obs,
        rng.integers(0, max(spec.num_actions, 1), count).astype(np.int32),
        rng.normal(size=count).astype(np.float32),
        np.full(count, 0.99, np.float32),
        np.roll(obs, 1, axis=0),
    )
    return codec.encode(transitions, source=0)


def _insert_rate(nodes, table: str, items: np.ndarray, seconds: float) -> float:
    """Items per second written by one writer per shard, ENVS_PER_ACTOR rows a write."""
    writers = [replay.connect(node).writer(table) for node in nodes]
    written, start = 0, time.perf_counter()
    priorities = np.ones(ENVS_PER_ACTOR)
    while time.perf_counter() - start < seconds:
        for writer in writers:
            first = written % (len(items) - ENVS_PER_ACTOR)
            writer.write(items[first : first + ENVS_PER_ACTOR], priorities)
            written += ENVS_PER_ACTOR
    for writer in writers:
        writer.close()
    return written / (time.perf_counter() - start)


def _sample_rate(nodes, table: str, codec, rows: int, seconds: float) -> float:
    sampler = replay.ReplayShards(nodes).sampler(table, codec)
    try:
        batches = sampler.batches(rows)
        next(batches)
        sampled, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            next(batches)
            sampled += rows
        return sampled / (time.perf_counter() - start)
    finally:
        sampler.close()


def _measure(nodes, builder, spec, batch_size: int, seconds: float) -> dict:
    layout = builder.replay_layout(spec)
    codec = layout.codec
    items = _items(codec, spec, 512, seed=0)
    inserts = _insert_rate(nodes, layout.sample_table, items, seconds)
    samples = _sample_rate(
        nodes, layout.sample_table, codec, batch_size * UPDATES_PER_SAMPLE, seconds
    )
    return {"inserts_per_s": inserts, "samples_per_s": samples}


def _builder(env_id: str):
    spec = envs.env_spec(env_id)
    codec_bytes = dqn.DQNBuilder(dqn.DQNConfig()).replay_layout(spec).codec.num_bytes
    capacity = max(1000, CAPACITY_BYTES // codec_bytes)
    config = dataclasses.replace(dqn.DQNConfig(), max_replay_size=capacity, min_replay_size=1)
    return dqn.DQNBuilder(config), spec


def _in_process(backend: str, builder, spec, num_shards: int):
    make = functools.partial(_tables, builder, spec, num_shards)
    return [replay.node_class(backend)(make) for _ in range(num_shards)]


def _on_ray(backend: str, builder, spec, num_shards: int):
    graph = program_lib.Program("replay-bench")
    with graph.group("replay", program_lib.Resources(num_cpus=0)):
        handles = [
            graph.add_node(
                replay.node_class(backend), functools.partial(_tables, builder, spec, num_shards)
            )
            for _ in range(num_shards)
        ]
    running = launchers.launch(graph, "ray", num_cpus=2)
    return running, [running.client(handle.name) for handle in handles]


def _cases():
    for env_id in _ENVS.value:
        for num_shards in (int(s) for s in _SHARDS.value):
            for place in _PLACES.value:
                yield env_id, num_shards, place


def main(argv):
    del argv
    rows, found = [], []
    for env_id, num_shards, place in _cases():
        builder, spec = _builder(env_id)
        for backend in [b for b in replay.BACKENDS if replay.installed(b)]:
            running = None
            if place == "ray":
                running, nodes = _on_ray(backend, builder, spec, num_shards)
            else:
                nodes = _in_process(backend, builder, spec, num_shards)
            try:
                for batch_size in (int(b) for b in _BATCHES.value):
                    result = _measure(nodes, builder, spec, batch_size, _SECONDS.value)
                    case = dict(env=env_id, shards=num_shards, place=place, batch=batch_size)
                    found.append({**case, "backend": backend, **result})
                    print(
                        f"{env_id:12s} shards {num_shards} {place:7s} batch {batch_size:3d} "
                        f"{backend:7s} inserts {result['inserts_per_s']:10,.0f}/s  "
                        f"samples {result['samples_per_s']:10,.0f}/s",
                        flush=True,
                    )
            finally:
                if running is not None:
                    running.stop()
                else:
                    for node in nodes:
                        node.close()
    keys = ("env", "shards", "place", "batch")
    for native in (r for r in found if r["backend"] == replay.NATIVE):
        same_case = [r for r in found if all(r[k] == native[k] for k in keys)]
        other = next((r for r in same_case if r["backend"] == replay.REVERB), None)
        if other is None:  # Reverb is the DeepMind set's: measured there
            continue
        rows.append(
            {
                **{k: native[k] for k in keys},
                "insert_ratio": native["inserts_per_s"] / other["inserts_per_s"],
                "sample_ratio": native["samples_per_s"] / other["samples_per_s"],
            }
        )
    for row in rows:
        print(
            f"native/Reverb  {row['env']:12s} shards {row['shards']} {row['place']:7s} "
            f"batch {row['batch']:3d}: inserts {row['insert_ratio']:6.2f}x  "
            f"samples {row['sample_ratio']:6.2f}x"
        )
    print(json.dumps({"measurements": found, "ratios": rows}))


if __name__ == "__main__":
    app.run(main)
