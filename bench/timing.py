"""What several benchmarks measure the same way: a timed loop, raw envpool stepping,
and the steady-state rates of a whole training program."""

import csv
import os
import tempfile
import time
from typing import Any

import numpy as np

from gorila_jax import builder as builder_lib
from gorila_jax import envs, types
from gorila_jax.run import experiment


def timed(fn, seconds: float, units_per_call: int) -> float:
    """Units per second of calling `fn` repeatedly for about `seconds` (after a warm-up)."""
    fn()
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        fn()
        calls += 1
    return calls * units_per_call / (time.perf_counter() - start)


def raw_envpool(spec: types.EnvSpec, num_envs: int, threads: int, seconds: float) -> float:
    env = envs.make_env(spec.env_id, num_envs, seed=0, num_threads=threads)
    env.reset()
    rng = np.random.default_rng(0)
    step = lambda: env.step(rng.integers(0, spec.num_actions, num_envs).astype(np.int32))
    rate = timed(step, seconds, num_envs)
    env.close()
    return rate


def pipeline_rates(
    builder: Any, env_id: str, launcher: str, num_actors: int, num_envs: int, seconds: float
) -> dict[str, Any]:
    """Runs the whole program for `seconds`; env steps/s and updates/s over its second half.

    The first half (start-up, compilation, filling replay) is left out. Also
    returns the last metrics row, for agent-specific figures.
    """
    logdir = tempfile.mkdtemp(prefix="pipeline-")
    exp = experiment.ExperimentConfig(
        env_id=env_id,
        launcher=launcher,
        num_actors=num_actors,
        num_envs_per_actor=num_envs,
        total_env_steps=10**9,
        max_wall_time_s=seconds,
        eval_interval_s=0,
        eval_episodes=1,
        num_learner_devices=1,
        cpus_per_actor=0.5,
        learner_cpus=0.5,
        replay_cpus=0.5,
        log_interval_s=2.0,
        checkpoint_interval_steps=0,
        logdir=logdir,
    )
    experiment.run_experiment(builder, exp)
    with open(os.path.join(logdir, "metrics.csv")) as f:
        rows = list(csv.DictReader(f))
    half = [row for row in rows if float(row["wall_time_s"]) >= seconds / 2]
    first, last = half[0], half[-1]
    elapsed = float(last["wall_time_s"]) - float(first["wall_time_s"])
    return {
        "env_steps_per_s": (float(last["env_steps"]) - float(first["env_steps"])) / elapsed,
        "updates_per_s": (float(last["learner_steps"]) - float(first["learner_steps"])) / elapsed,
        "last_row": last,
    }


def random_batch(builder, spec: types.EnvSpec, seed: int = 0) -> builder_lib.SampledBatch:
    """One global batch of the agent's replay items (its item codec's layout), random values.

    Both item kinds (DQN's `types.Transition`, PPO's `types.Trajectory`) get
    random observations and valid actions; the rest stays as decoded from
    zeros (PPO's behaviour log-probabilities 0, so weights are truncated at rho_bar).
    """
    rng = np.random.default_rng(seed)
    codec = builder.replay_layout(spec).codec
    size = builder.batch_plan.batch_size
    items = codec.decode(np.zeros((size, codec.num_bytes), np.uint8))
    observations = lambda x: rng.integers(0, 256, x.shape).astype(x.dtype)
    if spec.observation_dtype != "uint8":
        observations = lambda x: rng.normal(size=x.shape).astype(x.dtype)
    changes = {
        "observation": observations(items.observation),
        "action": rng.integers(0, max(spec.num_actions, 1), items.action.shape).astype(
            items.action.dtype
        ),
        "reward": rng.normal(size=items.reward.shape).astype(np.float32),
    }
    if isinstance(items, types.Transition):
        changes.update(
            next_observation=observations(items.next_observation),
            discount=np.full(items.discount.shape, 0.99, np.float32),
        )
    else:
        changes.update(
            valid=np.ones(items.valid.shape, bool),
            terminated=rng.random(items.terminated.shape) < 0.001,
        )
    items = items._replace(**changes)
    return builder_lib.SampledBatch(items, np.full(size, 1.0 / size), np.full(size, size))
