"""Gorila parameter server: bytes and update rate per compression scheme, and shard scaling.

Part 1, per scheme, on the Nature DQN parameters (Pong-v5, dueling head) and
a real gradient (one DQN loss gradient on random frames): bytes per update,
and full updates/s through one in-process shard (encode + decode + apply).
The baseline is `none` in the same run: `bytes_ratio` = none's bytes / the
scheme's, `rate_ratio` = the scheme's updates/s / none's.

Part 2, shard scaling: `--num_ps_shards` shards and `--pushers` pushing
processes under the ray launcher, each pusher sending slices of one update
to every shard for `--seconds`; full updates/s applied, for 1 -> 4 shards.

Part 3, a stated model (not a measurement) of how that scales to 40+
workers on many hosts; see `model` below. Last line: JSON.

  python bench/gorila_ps.py --seconds=10
"""

import concurrent.futures
import dataclasses
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
from gorila_jax import envs, parallel, types
from gorila_jax.distributed import launchers, program
from gorila_jax.gorila import compression, parameter_server, shard_node

_SECONDS = flags.DEFINE_float("seconds", 10.0, "Measuring time per configuration.")
_SHARDS = flags.DEFINE_list("num_ps_shards", ["1", "2", "4"], "Shard counts for part 2.")
_PUSHERS = flags.DEFINE_integer("pushers", 2, "Pushing processes in part 2.")
_BANDWIDTH = flags.DEFINE_float("model_gbit_per_s", 10.0, "Part 3: network bandwidth per host.")
_WORKER_RATE = flags.DEFINE_float(
    "model_worker_updates_per_s", 50.0, "Part 3: gradients/s one GPU worker computes."
)

ENV = "Pong-v5"
SEED = 0


def _builder() -> dqn.DQNBuilder:
    return dqn.DQNBuilder(dataclasses.replace(dqn.DQNConfig(), batch_size=32))


def real_gradient(builder, spec: types.EnvSpec) -> np.ndarray:
    """One flat DQN gradient on random frames: realistic magnitudes for `sparse`."""
    rng = np.random.default_rng(0)
    size = builder.config.batch_size
    frames = lambda: rng.integers(0, 256, (size, *spec.observation_shape), np.uint8)  # noqa: E731
    data = types.Transition(
        frames(),
        rng.integers(0, spec.num_actions, size).astype(np.int32),
        rng.choice([-1.0, 0.0, 1.0], size).astype(np.float32),
        np.full(size, 0.99**3, np.float32),
        frames(),
    )
    batch = builder_lib.SampledBatch(data, np.full(size, 1e-4), np.full(size, 10_000))
    state = builder.init_train_state(jax.random.PRNGKey(0), spec)
    devices = jax.devices()[:1]
    grads_fn = parallel.pmap_step(
        builder.update_fns(spec).compute_grads, devices, donate_state=False
    )
    grads, _ = grads_fn(parallel.replicate(state, devices), parallel.shard(batch, 1))
    grads = getattr(grads, "grads", grads)  # precision.CheckedGrads carries a skip flag
    layout = parameter_server.ShardLayout(state.params, 1)
    return layout.flatten(parallel.unreplicate(grads))


def scheme_rates(builder, spec, gradient: np.ndarray, seconds: float) -> list[dict]:
    layout, flat = parameter_server.initial_layout(builder, spec, SEED, 1)
    results = []
    for scheme in compression.GRADIENT_SCHEMES:
        shard = parameter_server.ParameterShard(flat, builder.shard_optimizer())
        compressor = compression.GradientCompressor(scheme)
        encoded = compressor.encode(gradient)
        shard.push(encoded, 0)  # compile
        count, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            encoded = compressor.encode(gradient)
            shard.push(encoded, shard.get()[0])
            count += 1
        results.append(
            {
                "scheme": scheme,
                "bytes_per_update": encoded.nbytes,
                "updates_per_s": count / (time.perf_counter() - start),
            }
        )
    none = results[0]
    for result in results:
        result["bytes_ratio"] = none["bytes_per_update"] / result["bytes_per_update"]
        result["rate_ratio"] = result["updates_per_s"] / none["updates_per_s"]
    return results


class PusherNode:
    """Bench-only node: pushes uncompressed slices of one gradient to every shard."""

    def __init__(self, shards: list, slices: list[slice], gradient: np.ndarray):
        self._shards = shards
        self._parts = [
            compression.GradientCompressor("none").encode(gradient[part]) for part in slices
        ]

    def push_for(self, seconds: float) -> int:
        count, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            futures = [s.futures.push(p, 0) for s, p in zip(self._shards, self._parts)]
            [future.result() for future in futures]
            count += 1
        return count


def shard_scaling(builder, spec, gradient: np.ndarray, num_shards: int, seconds: float) -> dict:
    layout, _ = parameter_server.initial_layout(builder, spec, SEED, num_shards)
    graph = program.Program("ps-bench")
    keep_all = shard_node.ShardSettings(max_staleness=-1)  # every pushed gradient is applied
    with graph.group("parameter_server", program.Resources(num_cpus=0.5)):
        shards = [
            graph.add_node(
                shard_node.ParameterShardNode, builder, spec, SEED, i, num_shards, keep_all
            )
            for i in range(num_shards)
        ]
    with graph.group("pusher", program.Resources(num_cpus=0.5)):
        for _ in range(_PUSHERS.value):
            graph.add_node(PusherNode, shards, layout.slices, gradient)
    with launchers.launch(graph, "ray", num_cpus=2 * (num_shards + _PUSHERS.value)) as running:
        pushers = [running.client(f"pusher/{i}") for i in range(_PUSHERS.value)]
        [p.push_for(1.0) for p in pushers]  # warm-up: compile every shard
        start = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(len(pushers)) as pool:
            counts = list(pool.map(lambda p: p.push_for(seconds), pushers))
        elapsed = time.perf_counter() - start
    return {"num_ps_shards": num_shards, "updates_per_s": sum(counts) / elapsed}


def model(params: int, one_shard_updates_per_s: float) -> list[dict]:
    """Applied updates/s for W workers and S shards on separate hosts.

    Assumptions: a shard's apply time scales with its slice (measured rate of
    one shard holding everything, times S); each update moves params*4 bytes
    up (gradients) and down (fresh parameters, one pull per push) and a
    shard's host link carries its 1/S share at `--model_gbit_per_s`; workers
    each offer `--model_worker_updates_per_s`. Shards work in parallel, so
    capacity = min(S * apply rate of one slice..., network) and the applied
    rate = min(W * worker rate, capacity).
    """
    bytes_per_update = 2 * 4 * params
    link = _BANDWIDTH.value * 1e9 / 8
    rows = []
    for shards in (1, 4, 16, 64):
        apply_capacity = one_shard_updates_per_s * shards
        network_capacity = link * shards / bytes_per_update
        capacity = min(apply_capacity, network_capacity)
        for workers in (1, 10, 40, 100):
            offered = workers * _WORKER_RATE.value
            rows.append(
                {
                    "num_ps_shards": shards,
                    "workers": workers,
                    "applied_updates_per_s": min(offered, capacity),
                    "bound": "workers"
                    if offered <= capacity
                    else ("apply" if apply_capacity < network_capacity else "network"),
                }
            )
    return rows


def main(argv):
    del argv
    spec = envs.env_spec(ENV)
    builder = _builder()
    gradient = real_gradient(builder, spec)
    schemes = scheme_rates(builder, spec, gradient, _SECONDS.value)
    for row in schemes:
        print(
            f"{row['scheme']:>7}: {row['bytes_per_update']:>10,} bytes/update "
            f"(x{row['bytes_ratio']:.1f} smaller), {row['updates_per_s']:7.1f} updates/s "
            f"(x{row['rate_ratio']:.2f})",
            flush=True,
        )
    scaling = [
        shard_scaling(builder, spec, gradient, int(n), _SECONDS.value) for n in _SHARDS.value
    ]
    for row in scaling:
        print(f"{row['num_ps_shards']} shard(s): {row['updates_per_s']:.1f} updates/s", flush=True)
    modelled = model(gradient.size, schemes[0]["updates_per_s"])
    print(
        json.dumps(
            {
                "bench": "gorila_ps",
                "params": int(gradient.size),
                "schemes": schemes,
                "shard_scaling": scaling,
                "model": modelled,
                "model_assumptions": {
                    "gbit_per_s": _BANDWIDTH.value,
                    "worker_updates_per_s": _WORKER_RATE.value,
                },
            }
        )
    )


if __name__ == "__main__":
    app.run(main)
