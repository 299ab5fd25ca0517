"""How much the learner node loses on top of the update and the sampling it cannot avoid.

Measures, each alone and in this run, at each batch size and for each replay backend
(`--replays`, native and Reverb one after the other):
  (a) the bare pmapped update on a batch already in device memory;
  (b) sampling batches of that size from the replay node (the learner's sampler);
then (c) learner-node updates per second fed from the filled replay node,
priority updates on. All three count updates: with the preset's
`updates_per_dispatch` K, (a) and (c) run K updates per device call and (b)
samples K batches' rows at once, as the node does. Prints all and
ratio = c / min(a, b). Last line: JSON,
the figures of one batch size at the top level; with several sizes, a
"results" list of those, one per size.

  python bench/learner_throughput.py --env=CartPole-v1 --batch_size=256
  python bench/learner_throughput.py --env=Pong-v5 --batch_size=256
  python bench/learner_throughput.py --env=Pong-v5 --precision=bf16 --batch_size=256,512,1024
"""

import dataclasses
import functools
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

from agents import dqn  # noqa: E402
from gorila_jax import builder as builder_lib
from gorila_jax import envs, parallel, replay, types
from gorila_jax.learning import learner
from gorila_jax.learning import step as step_lib
from agents.dqn import presets as dqn_presets  # noqa: E402
from launch import presets  # noqa: E402

_ENV = flags.DEFINE_string("env", "CartPole-v1", "envpool task id.")
_BATCH = flags.DEFINE_multi_string(
    "batch_size", ["256"], "Learner batch; repeat the flag or give a comma list for several."
)
_PRECISION = flags.DEFINE_enum(
    "precision", "fp32", ["fp32", "bf16", "fp16"], "Learner compute precision."
)
_ITEMS = flags.DEFINE_integer("items", 20_000, "Transitions in the table.")
_SECONDS = flags.DEFINE_float("seconds", 10.0, "Measuring time per stage.")
_REPLAYS = flags.DEFINE_list(
    "replays",
    [backend for backend in replay.BACKENDS if replay.installed(backend)],
    "Replay backends to measure (default: those this set installs).",
)


def _random_transitions(spec: types.EnvSpec, count: int, seed: int = 0) -> types.Transition:
    rng = np.random.default_rng(seed)
    if spec.observation_dtype == "uint8":
        obs = rng.integers(0, 256, (count, *spec.observation_shape), dtype=np.uint8)
    else:
        obs = rng.normal(size=(count, *spec.observation_shape)).astype(spec.observation_dtype)
    return types.Transition(
        obs,
        rng.integers(0, spec.num_actions, count).astype(np.int32),
        rng.normal(size=count).astype(np.float32),
        np.full(count, 0.97, np.float32),
        np.roll(obs, 1, axis=0),
    )


def _rate(fn, seconds: float, drain=lambda: None) -> float:
    """Calls of `fn` per second; `drain` waits for work `fn` only dispatched."""
    fn()
    drain()
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        fn()
        calls += 1
    drain()
    return calls / (time.perf_counter() - start)


def bare_update(builder, spec, batch_size: int, seconds: float) -> float:
    """Updates per second of the guarded step the learner node runs, on one batch kept on
    the device: `updates_per_dispatch` updates per call, as the node's."""
    devices = jax.local_devices()
    updates = builder.batch_plan.updates_per_dispatch
    step = parallel.pmap_step(
        step_lib.make_step(builder, spec, updates=updates), devices, step_lib.OUT_AXES
    )
    rows = batch_size * updates
    data = _random_transitions(spec, rows, seed=1)
    sampled = builder_lib.SampledBatch(data, np.full(rows, 1.0 / rows), np.full(rows, rows))
    batch = parallel.shard_to_devices(sampled, devices)
    state = [parallel.replicate(builder.init_train_state(jax.random.PRNGKey(0), spec), devices)]
    guard = [parallel.replicate(step_lib.init_guard(), devices)]

    def one_update():
        state[0], guard[0], info, _ = step(state[0], guard[0], batch)
        jax.block_until_ready(info.metrics)

    return _rate(one_update, seconds) * updates


def _batch_sizes(values: list[str]) -> list[int]:
    try:
        sizes = [int(v) for value in values for v in value.split(",") if v.strip()]
    except ValueError:
        raise app.UsageError(f"--batch_size takes integers, got {values}") from None
    if not sizes or min(sizes) <= 0:
        raise app.UsageError(f"--batch_size must be positive, got {values}")
    return sizes


def measure(config, spec, replay_node, seconds: float) -> dict:
    """(a), (b) and (c) at `config.batch_size`, from the filled `replay_node`."""
    builder = dqn.DQNBuilder(config)
    updates = builder.batch_plan.updates_per_dispatch
    a = bare_update(builder, spec, config.batch_size, seconds)
    sampler = replay.ReplayShards(replay_node).sampler(
        dqn.builder.TABLE, builder.replay_layout(spec).codec
    )
    batches = sampler.batches(config.batch_size * updates)
    b = _rate(lambda: next(batches), seconds) * updates
    sampler.close()
    node = learner.LearnerNode(builder, spec, replay_node, None, seed=0)
    # node.step returns once the update is dispatched; fetching the published
    # parameters waits for the last one, so only finished updates count.
    c = _rate(functools.partial(node.step, timeout=60.0), seconds, drain=node.get_params)
    c *= updates
    node.stop()
    node.close()
    ratio = c / min(a, b)
    print(
        f"(a) bare update          {a:10,.1f} updates/s (batch {config.batch_size}, "
        f"{config.precision}, {jax.local_device_count()} device(s), {updates} per call)"
    )
    print(f"(b) replay sampling      {b:10,.1f} batches/s (sampled {updates} at once)")
    print(f"(c) learner node         {c:10,.1f} updates/s (priority updates on)")
    print(f"ratio c/min(a,b)         {ratio:10.2f}", flush=True)
    return {
        "batch_size": config.batch_size,
        "updates_per_dispatch": updates,
        "bare_updates_per_s": a,
        "sampled_batches_per_s": b,
        "learner_updates_per_s": c,
        "ratio": ratio,
    }


def main(argv):
    del argv
    sizes = _batch_sizes(_BATCH.value)
    spec = envs.env_spec(_ENV.value)
    config, _ = dqn_presets.dqn_preset(presets.resolve("auto", _ENV.value))
    config = dataclasses.replace(
        config,
        batch_size=sizes[0],
        precision=_PRECISION.value,
        min_replay_size=1,
        max_replay_size=_ITEMS.value,
    )
    builder = dqn.DQNBuilder(config)
    # A table without the samples-per-insert limit: we measure the learner, not the ratio.
    layout = builder.replay_layout(spec)
    table = dataclasses.replace(layout.tables[0], rate_limit=replay.RateLimit(1))
    codec = layout.codec
    results = []
    for backend in _REPLAYS.value:
        node = replay.node_class(backend)(lambda: [table])
        writer = replay.connect(node).writer(dqn.builder.TABLE)
        for start in range(0, _ITEMS.value, 1000):
            count = min(1000, _ITEMS.value - start)
            items = codec.encode(_random_transitions(spec, count, seed=start))
            writer.write(items, np.ones(count))
        writer.close()
        print(f"replay: {backend}", flush=True)
        for size in sizes:
            sized = dataclasses.replace(config, batch_size=size)
            results.append({"replay": backend, **measure(sized, spec, node, _SECONDS.value)})
        node.close()
    header = {
        "bench": "learner_throughput",
        "env": spec.env_id,
        "precision": _PRECISION.value,
        "devices": jax.local_device_count(),
    }
    print(
        json.dumps(
            {**header, **results[0]} if len(results) == 1 else {**header, "results": results}
        )
    )


if __name__ == "__main__":
    app.run(main)
