"""PPO's learner update against DQN's on the same torso, per update and per sample-gradient.

Both run in this process as the learner runs them (`step.make_step` under
`parallel.pmap_step`, one device, the batch already in device memory), on the
env's preset networks (Pong-v5: the Nature torso, 512 hidden units). For each:
compile time, seconds per update (median of `--repeats`), sample-gradients
per update (PPO: epochs x chunks x steps; DQN: the batch), XLA's FLOP count
of the compiled step (`cost_analysis`, which counts a loop body once: PPO's
figure is exact only with 1 epoch of 1 minibatch), and how many of its convolutions are
not in the NHWC x HWIO -> NHWC form that XLA:CPU runs with Eigen
(`noncanonical_convs`, from the compiled HLO; see agents/conv.py). ratio =
PPO seconds per update / DQN seconds per update. `--conv=xla` measures with
plain `lax.conv_general_dilated` (the state before agents/conv.py).
Last line: JSON.

  python bench/ppo_vs_dqn_update.py --env=Pong-v5
  python bench/ppo_vs_dqn_update.py --env=Pong-v5 --conv=xla --trajectory_length=32 \
      --batch_size=4 --num_epochs=1 --num_minibatches=1
"""

import dataclasses
import json
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

from agents import conv, dqn, ppo  # noqa: E402
from bench import timing  # noqa: E402
from agents.ppo import learning  # noqa: E402
from gorila_jax import builder as builder_lib  # noqa: E402
from gorila_jax import envs, parallel, types  # noqa: E402
from gorila_jax.learning import step as step_lib  # noqa: E402
from agents.dqn import presets as dqn_presets  # noqa: E402
from agents.ppo import presets as ppo_presets  # noqa: E402
from launch import presets  # noqa: E402

_ENV = flags.DEFINE_string("env", "Pong-v5", "envpool Atari task id.")
_LENGTH = flags.DEFINE_integer("trajectory_length", 128, "PPO steps per chunk.")
_BATCH = flags.DEFINE_integer("batch_size", 8, "PPO chunks per update (one actor).")
_EPOCHS = flags.DEFINE_integer("num_epochs", 4, "PPO passes over each batch.")
_MINIBATCHES = flags.DEFINE_integer("num_minibatches", 4, "PPO minibatches per pass.")
_DQN_BATCH = flags.DEFINE_integer("dqn_batch_size", 256, "DQN transitions per update.")
_CONV = flags.DEFINE_enum(
    "conv", "canonical", ["canonical", "xla"], "agents/conv.py's convolution, or plain lax."
)
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed updates of each (after the first).")

_CANONICAL_CONV = "dim_labels=b01f_01io->b01f"


def _ppo_batch(builder: ppo.PPOBuilder, spec: types.EnvSpec) -> builder_lib.SampledBatch:
    """Random frames and actions, acted by a uniform policy (what PPO's first update sees)."""
    chunks, length = builder.config.global_batch_size, builder.config.trajectory_length
    rng = np.random.default_rng(0)
    shape = (chunks, length)
    actions = rng.integers(0, spec.num_actions, shape).astype(np.int32)
    traj = types.Trajectory(
        observation=rng.integers(0, 256, (chunks, length + 1, *spec.observation_shape), np.uint8),
        action=actions,
        reward=rng.normal(size=shape).astype(np.float32),
        terminated=np.zeros(shape, bool),
        truncated=np.zeros(shape, bool),
        valid=np.ones(shape, bool),
        extras=learning.PolicyExtras(
            np.full(shape, -np.log(spec.num_actions), np.float32),
            np.zeros(shape, np.float32),
            actions,
        ),
        param_version=np.zeros(shape, np.int32),
        actor_index=np.zeros(chunks, np.int32),
    )
    return builder_lib.SampledBatch(traj, np.ones(chunks), np.full(chunks, chunks))


def measure(builder, spec: types.EnvSpec, batch, repeats: int) -> dict:
    """Compile time, median seconds per update, FLOPs and non-canonical convolutions."""
    devices = jax.local_devices()[:1]
    step = parallel.pmap_step(step_lib.make_step(builder, spec), devices, step_lib.OUT_AXES)
    state = parallel.replicate(builder.init_train_state(jax.random.PRNGKey(0), spec), devices)
    guard = parallel.replicate(step_lib.init_guard(), devices)
    batch = parallel.shard_to_devices(batch, devices)
    start = time.perf_counter()
    compiled = step.lower(state, guard, batch).compile()
    compile_s = time.perf_counter() - start
    hlo = compiled.as_text()
    convs = re.findall(r"convolution\([^\n]*", hlo)
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    times = []
    for _ in range(repeats + 1):  # the first call also loads the executable
        start = time.perf_counter()
        state, guard, info, _ = compiled(state, guard, batch)
        jax.block_until_ready(info.metrics)
        times.append(time.perf_counter() - start)
    return {
        "compile_s": compile_s,
        "update_s": float(np.median(times[1:])),
        "flops": float(cost.get("flops", float("nan"))),
        "convolutions": len(convs),
        "noncanonical_convs": sum(_CANONICAL_CONV not in line for line in convs),
    }


def _ppo_builder(env_id: str) -> ppo.PPOBuilder:
    config, _ = ppo_presets.ppo_preset(presets.resolve("auto", env_id))
    return ppo.PPOBuilder(
        dataclasses.replace(
            config,
            num_actors=1,
            trajectory_length=_LENGTH.value,
            batch_size=_BATCH.value,
            num_epochs=_EPOCHS.value,
            num_minibatches=_MINIBATCHES.value,
        )
    )


def main(argv):
    del argv
    if _CONV.value == "xla":
        conv.conv_general_dilated = jax.lax.conv_general_dilated  # the torsos look it up per call
    spec = envs.env_spec(_ENV.value)
    ppo_builder = _ppo_builder(_ENV.value)
    cfg = ppo_builder.config
    dqn_config, _ = dqn_presets.dqn_preset(presets.resolve("auto", _ENV.value))
    dqn_builder = dqn.DQNBuilder(dataclasses.replace(dqn_config, batch_size=_DQN_BATCH.value))
    steps = cfg.global_batch_size * cfg.trajectory_length
    results = {
        "ppo": {
            **measure(ppo_builder, spec, _ppo_batch(ppo_builder, spec), _REPEATS.value),
            "sample_grads": cfg.num_epochs * steps,
            "minibatch_size": steps // cfg.num_minibatches,
            "env_steps": steps,
        },
        "dqn": {
            **measure(dqn_builder, spec, timing.random_batch(dqn_builder, spec), _REPEATS.value),
            "sample_grads": _DQN_BATCH.value,
        },
    }
    for name, r in results.items():
        r["s_per_sample_grad"] = r["update_s"] / r["sample_grads"]
        r["flops_per_sample_grad"] = r["flops"] / r["sample_grads"]
        r["gflop_per_s"] = r["flops"] / r["update_s"] / 1e9
        print(
            f"{name}: {r['update_s']:.3f} s/update (compile {r['compile_s']:.1f} s), "
            f"{r['sample_grads']} sample-grads: {1e3 * r['s_per_sample_grad']:.2f} ms and "
            f"{r['flops_per_sample_grad'] / 1e6:.0f} MFLOP each, {r['gflop_per_s']:.1f} GFLOP/s; "
            f"{r['noncanonical_convs']} of {r['convolutions']} convolutions non-canonical",
            flush=True,
        )
    ppo_r, dqn_r = results["ppo"], results["dqn"]
    ratio = ppo_r["update_s"] / dqn_r["update_s"]
    per_grad = ppo_r["s_per_sample_grad"] / dqn_r["s_per_sample_grad"]
    print(f"PPO/DQN per update {ratio:.2f}, per sample-grad {per_grad:.2f}")
    print(
        json.dumps(
            {
                "bench": "ppo_vs_dqn_update",
                "env": spec.env_id,
                "conv": _CONV.value,
                "ppo_config": {
                    "trajectory_length": cfg.trajectory_length,
                    "chunks": cfg.global_batch_size,
                    "num_epochs": cfg.num_epochs,
                    "num_minibatches": cfg.num_minibatches,
                },
                **results,
                "ratio_per_update": ratio,
                "ratio_per_sample_grad": per_grad,
                # Env steps/s the learner alone allows (PPO learns from each step once).
                "ppo_learner_bound_env_steps_per_s": ppo_r["env_steps"] / ppo_r["update_s"],
            }
        )
    )


if __name__ == "__main__":
    app.run(main)
