"""Learner updates/s of DQN and PPO on an Atari task's shapes, by precision and device count.

For each agent (its `--preset=auto` config for `--env`) and each mode, times
the learner node's step (`step.make_step` under `parallel.pmap_step`: the
guarded update the learner runs) on a random batch already on the devices:
  fp32  float32 compute, float32 matmuls (`precision.use_tf32(False)`);
  bf16  the agents' bfloat16 compute (`config.precision="bf16"`);
  tf32  float32 compute with TensorFloat-32 matmuls (`precision.use_tf32(True)`,
        the learner's `--tf32`); on CPU the same as fp32.
Every mode runs pmapped over all the devices present (one global batch split
over them); with more than one device, fp32 also runs on one, for the
scaling. Values in the batch are random: the work of an update does not
depend on them. After each measurement, a JSON line of the results so far
("complete": true on the last line).

  python bench/gpu_learner.py                      # Pong-v5, both agents, all modes
  python bench/gpu_learner.py --check_devices --require_gpu   # what bench/gpu_check.sh asks
  python bench/gpu_learner.py --seconds=0.2 --dqn_batch_size=8 --ppo_chunks=4 \
      --ppo_trajectory_length=8                    # a CPU smoke run
"""

import dataclasses
import json
import os
import sys
import time
from typing import NamedTuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

from bench import timing  # noqa: E402
from bench.recorded_specs import learner_spec  # noqa: E402
from agents import registry  # noqa: E402
from gorila_jax import builder as builder_lib  # noqa: E402
from gorila_jax import parallel, precision, types  # noqa: E402
from gorila_jax.learning import step as step_lib  # noqa: E402
from launch import presets  # noqa: E402


class Mode(NamedTuple):
    """One precision mode: the agent config's `precision` and the learner's `tf32` setting."""

    config_precision: str
    tf32: bool


MODES = {"fp32": Mode("fp32", False), "bf16": Mode("bf16", False), "tf32": Mode("fp32", True)}
AGENTS = ("dqn", "ppo")

_ENV = flags.DEFINE_string("env", "Pong-v5", "envpool task id whose shapes the batches take.")
_AGENTS = flags.DEFINE_list("agents", list(AGENTS), f"Agents to time, of {AGENTS}.")
_MODES = flags.DEFINE_list("modes", list(MODES), f"Precision modes, of {tuple(MODES)}.")
_SECONDS = flags.DEFINE_float("seconds", 3.0, "Timed seconds per measurement (>= 2 updates).")
_DQN_BATCH = flags.DEFINE_integer("dqn_batch_size", 0, "DQN batch; 0: the preset's.")
_PPO_CHUNKS = flags.DEFINE_integer(
    "ppo_chunks", 0, "PPO trajectory chunks per update; 0: the preset's global batch."
)
_PPO_LENGTH = flags.DEFINE_integer(
    "ppo_trajectory_length", 0, "PPO steps per chunk; 0: the preset's."
)
_CHECK = flags.DEFINE_bool(
    "check_devices", False, "Only report the devices JAX sees (and run a conv on one); no timing."
)
_REQUIRE_GPU = flags.DEFINE_bool(
    "require_gpu", False, "Exit 1 with a message unless JAX's default backend is a GPU."
)


def device_report() -> dict:
    """The backend and devices JAX sees; a small conv and matmul prove they compute."""
    devices = jax.local_devices()
    x = jax.device_put(np.ones((8, 84, 84, 4), np.float32), devices[0])
    kernel = jax.device_put(np.ones((8, 8, 4, 32), np.float32), devices[0])
    # A conv goes through cuDNN and a matmul through cuBLAS on a GPU: a library that
    # does not load fails here, before any benchmark, with its own error.
    conv = jax.lax.conv_general_dilated(
        x, kernel, (4, 4), "VALID", (1, 1), None, ("NHWC", "HWIO", "NHWC")
    )
    total = float(jax.numpy.sum(conv.reshape(8, -1) @ conv.reshape(8, -1).T))
    return {
        "jax_version": jax.__version__,
        "backend": jax.default_backend(),
        "devices": len(devices),
        "device_kind": devices[0].device_kind,
        "compute_check": total > 0,
    }


def _config(agent: str, mode: Mode, env_id: str):
    """The agent's auto preset for `env_id` in `mode`, with the batch flags applied."""
    config, _ = presets.load("auto", agent, env_id, set(), spec=learner_spec(env_id))
    changes: dict = {"precision": mode.config_precision}
    if agent == "dqn" and _DQN_BATCH.value:
        changes["batch_size"] = _DQN_BATCH.value
    if agent == "ppo" and _PPO_CHUNKS.value:
        # The chunk count as given, not scaled by the actor count.
        changes.update(batch_size=_PPO_CHUNKS.value, scale_batch_with_actors=False)
    if agent == "ppo" and _PPO_LENGTH.value:
        changes["trajectory_length"] = _PPO_LENGTH.value
    return dataclasses.replace(config, **changes)


def samples_per_update(agent: str, config) -> int:
    """Replay samples one update learns from: DQN transitions, PPO env steps."""
    if agent == "ppo":
        return config.global_batch_size * config.trajectory_length
    return config.batch_size


def measure(agent: str, mode_name: str, devices: list, spec: types.EnvSpec, seconds: float):
    """Updates/s of one agent in one mode, pmapped over `devices`."""
    mode = MODES[mode_name]
    precision.use_tf32(mode.tf32)  # read when the step is traced, below
    config = _config(agent, mode, spec.env_id)
    builder = registry.AGENTS[agent].builder(config)
    builder.validate(len(devices), spec)  # names the setting when the batch does not split
    step = parallel.pmap_step(step_lib.make_step(builder, spec), devices, step_lib.OUT_AXES)
    batch = parallel.shard_to_devices(timing.random_batch(builder, spec), devices)
    state = parallel.replicate(builder_lib.initial_train_state(builder, spec, 0), devices)
    guard = parallel.replicate(step_lib.init_guard(), devices)

    start = time.perf_counter()
    state, guard, info, _ = step(state, guard, batch)
    jax.block_until_ready(info.metrics)
    compile_s = time.perf_counter() - start
    updates, start = 0, time.perf_counter()
    while updates < 2 or time.perf_counter() - start < seconds:
        state, guard, info, _ = step(state, guard, batch)
        jax.block_until_ready(info.metrics)
        updates += 1
    rate = updates / (time.perf_counter() - start)
    samples = samples_per_update(agent, config)
    skipped = float(np.asarray(info.metrics["nonfinite_skipped_steps"]).reshape(-1)[0])
    print(
        f"{agent:4s} {mode_name:5s} {len(devices)} device(s): {rate:9.2f} updates/s "
        f"({rate * samples:12,.0f} samples/s of {samples}/update; compile+first {compile_s:.1f}s)",
        flush=True,
    )
    return {
        "agent": agent,
        "mode": mode_name,
        "devices": len(devices),
        "samples_per_update": samples,
        "updates_per_s": rate,
        "samples_per_s": rate * samples,
        "first_update_s": compile_s,
        "nonfinite_skipped_steps": skipped,
    }


def _check_names(given: list[str], known, flag: str) -> None:
    unknown = sorted(set(given) - set(known))
    if unknown or not given:
        raise app.UsageError(f"--{flag} takes names of {tuple(known)}, got {given}")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    report = device_report()
    if _REQUIRE_GPU.value and report["backend"] != "gpu":
        sys.exit(
            f"error: JAX's default backend is {report['backend']!r}, not 'gpu' "
            f"({report['devices']} {report['device_kind']} device(s)): the CUDA plugin "
            "(requirements-gpu.txt) is missing or found no usable GPU (nvidia-smi shows what the "
            "driver sees; TF_CPP_MIN_LOG_LEVEL=0 shows XLA's reasons)"
        )
    if _CHECK.value:
        print(json.dumps({"bench": "gpu_devices", **report}))
        return
    _check_names(_AGENTS.value, AGENTS, "agents")
    _check_names(_MODES.value, MODES, "modes")
    spec = learner_spec(_ENV.value)
    every = jax.local_devices()
    runs = [(agent, mode, every) for agent in _AGENTS.value for mode in _MODES.value]
    if len(every) > 1:  # the scaling: the same global batch on one device
        runs += [(agent, "fp32", every[:1]) for agent in _AGENTS.value if "fp32" in _MODES.value]
    header = {"bench": "gpu_learner", "env": spec.env_id, **report}
    results = []
    for agent, mode, devices in runs:
        results.append(measure(agent, mode, devices, spec, _SECONDS.value))
        # The report so far after each measurement: a run stopped by its time limit
        # (bench/gpu_check.sh) still leaves the figures it has as its last JSON line.
        done = len(results) == len(runs)
        print(json.dumps({**header, "complete": done, "results": results}), flush=True)
    precision.use_tf32(False)


if __name__ == "__main__":
    app.run(main)
