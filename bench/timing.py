"""What several benchmarks measure the same way: a timed loop, raw envpool stepping."""

import time

import numpy as np

from gorila_jax import envs, types


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
