"""The learner's pmapped DQN step with 1, 20 and 200 updates queued before each wait, on
N host devices: updates/s, and whether XLA's CPU collectives survive a deep queue. The
ratio to read is each depth against in_flight=1, in the same run.

  python bench/pmap_queue_depth.py            # 4 devices
  python bench/pmap_queue_depth.py --devices=1

On the 2-core machine (2026-12-05), 4 forced CPU devices: JAX 0.4.34 (DeepMind set)
366, 429 and 450 updates/s; JAX 0.11.2 (default set) 554 and 606, then at 200 queued
the all-reduce's rendezvous timed out after 40 s ("only 3 of 4 threads arrived") and
XLA aborted the process. The learner never queues more than 2 (BUILD_NOTES.md, Known
limits).
"""

import dataclasses
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from absl import app, flags  # noqa: E402

_DEVICES = flags.DEFINE_integer("devices", 4, "Forced host devices.", lower_bound=1)
_DEPTHS = flags.DEFINE_list("in_flight", ["1", "20", "200"], "Updates queued per wait.")
_SECONDS = flags.DEFINE_float("seconds", 5.0, "Timed seconds per depth.")
_BATCH = 256


def _batch(seed: int):
    import numpy as np

    from gorila_jax import builder as builder_lib
    from gorila_jax import types

    rng = np.random.default_rng(seed)
    data = types.Transition(
        observation=rng.normal(size=(_BATCH, 4)).astype(np.float32),
        action=rng.integers(0, 2, _BATCH).astype(np.int32),
        reward=rng.normal(size=_BATCH).astype(np.float32),
        discount=np.full(_BATCH, 0.97, np.float32),
        next_observation=rng.normal(size=(_BATCH, 4)).astype(np.float32),
    )
    size = 10 * _BATCH
    return builder_lib.SampledBatch(data, np.full(_BATCH, 1 / size), np.full(_BATCH, size))


def main(_):
    # Before jax is imported: the device count is fixed at its first use.
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={_DEVICES.value}"
    import jax

    from agents import dqn
    from gorila_jax import envs, parallel
    from gorila_jax.learning import step as step_lib

    spec = envs.env_spec("CartPole-v1")
    builder = dqn.DQNBuilder(
        dataclasses.replace(dqn.DQNConfig(), hidden_sizes=(64, 64), batch_size=_BATCH)
    )
    devices = jax.devices()[: _DEVICES.value]
    step = parallel.pmap_step(step_lib.make_step(builder, spec), devices, step_lib.OUT_AXES)
    state = parallel.replicate(builder.init_train_state(jax.random.PRNGKey(0), spec), devices)
    guard = parallel.replicate(step_lib.init_guard(), devices)
    batches = [parallel.shard_to_devices(_batch(seed), devices) for seed in range(8)]
    for k in range(3):  # compile
        state, guard, _, _ = step(state, guard, batches[k])
    jax.block_until_ready(state)
    rates = {}
    for depth in map(int, _DEPTHS.value):
        start, count = time.perf_counter(), 0
        while time.perf_counter() - start < _SECONDS.value:
            for k in range(depth):
                state, guard, _, _ = step(state, guard, batches[k % len(batches)])
            jax.block_until_ready(state)
            count += depth
        rates[depth] = count / (time.perf_counter() - start)
        print(
            f"jax {jax.__version__}, {len(devices)} devices, {depth} in flight: "
            f"{rates[depth]:.0f} updates/s ({rates[depth] / rates[min(rates)]:.2f}x)",
            flush=True,
        )


if __name__ == "__main__":
    app.run(main)
