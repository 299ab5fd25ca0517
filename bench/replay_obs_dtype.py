"""Observations in replay as float32, bfloat16 or float8: bytes per item, sampling and updates.

For each `--config.replay_obs_dtype`, in this one run and against float32's
figures from it: the packed item's bytes; Reverb batches/s sampled and
decoded from a filled table; and learner updates/s when each batch comes
from the host in its storage dtype (copied to the device, expanded to float32
there, then SAC's or DQN's guarded update). Last line: JSON.

  python bench/replay_obs_dtype.py --env=HalfCheetah-v4
  python bench/replay_obs_dtype.py --env=CartPole-v1 --agent=dqn
"""

import dataclasses
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402
import reverb  # noqa: E402
from absl import app, flags  # noqa: E402

from bench import timing  # noqa: E402
from agents import registry  # noqa: E402
from gorila_jax import builder as builder_lib  # noqa: E402
from gorila_jax import envs, parallel, replay, types  # noqa: E402
from gorila_jax.learning import step as step_lib  # noqa: E402
from launch import presets  # noqa: E402

_ENV = flags.DEFINE_string("env", "HalfCheetah-v4", "envpool task id (float observations).")
_AGENT = flags.DEFINE_enum("agent", "sac", ["sac", "dqn"], "Whose codec and update.")
_ITEMS = flags.DEFINE_integer("items", 20_000, "Transitions in the table.")
_SECONDS = flags.DEFINE_float("seconds", 5.0, "Measuring time per stage.")


def _transitions(spec: types.EnvSpec, count: int) -> types.Transition:
    """Observations from a random policy (so float8's scale fits them as it will in a run)."""
    env = envs.make_env(spec.env_id, 16, seed=1)
    rng = np.random.default_rng(1)
    rows, obs = [], np.asarray(env.reset()[0], np.float32)
    while sum(len(r) for r in rows) < count + 1:
        rows.append(obs)
        obs = np.asarray(env.step(envs.uniform_random_actions(spec, rng, 16))[0], np.float32)
    env.close()
    observations = np.concatenate(rows)[: count + 1]
    return types.Transition(
        observations[:-1],
        envs.uniform_random_actions(spec, rng, count),
        rng.normal(size=count).astype(np.float32),
        np.full(count, 0.99, np.float32),
        observations[1:],
    )


def measure(builder, spec, items: types.Transition, seconds: float) -> dict:
    layout = builder.replay_layout(spec)
    codec = layout.codec
    table = dataclasses.replace(layout.tables[0], rate_limit=replay.RateLimit(1))
    server = reverb.Server([replay.reverb_table(table)])
    address = f"localhost:{server.port}"
    writer = replay.TransitionWriter(reverb.Client(address), layout.sample_table)
    count = len(items.reward)
    for start in range(0, count, 1000):
        chunk = types.Transition(*(x[start : start + 1000] for x in items))
        writer.write(codec.encode(chunk), np.ones(len(chunk.reward)))
    writer.flush()
    writer.close()
    batch_size = builder.batch_plan.batch_size
    batches = replay.batches(address, layout.sample_table, batch_size, codec)
    sampled = timing.timed(lambda: next(batches), seconds, 1)
    host_batch = next(batches)
    server.stop()

    devices = jax.local_devices()[:1]
    step = parallel.pmap_step(step_lib.make_step(builder, spec), devices, step_lib.OUT_AXES)
    state = [parallel.replicate(builder.init_train_state(jax.random.PRNGKey(0), spec), devices)]
    guard = [parallel.replicate(step_lib.init_guard(), devices)]
    batch = builder_lib.SampledBatch(
        host_batch.data, host_batch.probabilities, host_batch.table_size
    )

    def one_update():  # the host->device copy of the stored dtype is part of it, as in a run
        on_device = parallel.shard_to_devices(batch, devices)
        state[0], guard[0], info, _ = step(state[0], guard[0], on_device)
        jax.block_until_ready(info.metrics)

    updates = timing.timed(one_update, seconds, 1)
    return {
        "bytes_per_item": codec.num_bytes,
        "sampled_batches_per_s": sampled,
        "updates_per_s": updates,
    }


def main(argv):
    del argv
    spec = envs.env_spec(_ENV.value)
    agent = registry.AGENTS[_AGENT.value]
    config, _ = agent.preset(presets.resolve("auto", _ENV.value, _AGENT.value))
    items = _transitions(spec, _ITEMS.value)
    results = {}
    for dtype_name in replay.STORAGE_DTYPES:
        config = dataclasses.replace(
            config, replay_obs_dtype=dtype_name, min_replay_size=1, max_replay_size=_ITEMS.value
        )
        results[dtype_name] = measure(agent.builder(config), spec, items, _SECONDS.value)
        base = results["float32"]
        figures = results[dtype_name]
        for key in list(figures):
            figures[f"{key}_vs_float32"] = figures[key] / base[key]
        print(
            f"{dtype_name:12s} {figures['bytes_per_item']:5d} bytes/item "
            f"({figures['bytes_per_item_vs_float32']:.2f}x) | "
            f"{figures['sampled_batches_per_s']:8.1f} sampled batches/s "
            f"({figures['sampled_batches_per_s_vs_float32']:.2f}x) | "
            f"{figures['updates_per_s']:8.1f} updates/s "
            f"({figures['updates_per_s_vs_float32']:.2f}x)",
            flush=True,
        )
    print(
        json.dumps(
            {"bench": "replay_obs_dtype", "env": spec.env_id, "agent": _AGENT.value, **results}
        )
    )


if __name__ == "__main__":
    app.run(main)
