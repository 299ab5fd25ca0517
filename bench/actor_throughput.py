"""How much an actor node loses on top of the three costs it cannot avoid.

Measures, each alone and in this run:
  (a) raw envpool stepping with vectorized random actions (same env, envs, threads);
  (b) the bare jitted policy on observation batches of the same shape;
  (c) inserting the same transitions into the replay through the writer the actor uses;
then (d) one actor node doing all three; (c) and (d) for each replay backend (`--replays`,
native and Reverb one after the other). Prints every rate and
ratio = d * (1/a + 1/b + 1/c): the actor's rate over doing the three one after
another (1.0 = no overhead; above 1 = the stages overlap). Last line: JSON.

  python bench/actor_throughput.py --env=CartPole-v1
  python bench/actor_throughput.py --env=Pong-v5 --num_envs=8
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
from bench import timing  # noqa: E402
from gorila_jax import builder as builder_lib  # noqa: E402
from gorila_jax import envs, replay, types
from gorila_jax.acting import actor
from gorila_jax.acting.settings import ActorSettings
from gorila_jax.distributed import launchers, program
from gorila_jax.learning import learner
from agents.dqn import presets as dqn_presets  # noqa: E402
from launch import presets  # noqa: E402

_ENV = flags.DEFINE_string("env", "CartPole-v1", "envpool task id.")
_NUM_ENVS = flags.DEFINE_integer("num_envs", 8, "Envs in the actor's envpool.")
_THREADS = flags.DEFINE_integer("env_threads", 1, "envpool threads, as --env_threads_per_actor.")
_SECONDS = flags.DEFINE_float("seconds", 10.0, "Measuring time per stage.")
_REPLAYS = flags.DEFINE_list(
    "replays",
    [backend for backend in replay.BACKENDS if replay.installed(backend)],
    "Replay backends to measure (default: those this set installs).",
)


def bare_policy(builder, spec: types.EnvSpec, num_envs: int, seconds: float) -> float:
    params = jax.device_put(builder.init_train_state(jax.random.PRNGKey(0), spec).params)
    policy = builder.make_policy(spec, 0, 1, evaluation=False)
    obs = spec.zeros_observation(num_envs)
    key = jax.random.PRNGKey(0)
    return timing.timed(lambda: np.asarray(policy(params, obs, key, 0)), seconds, num_envs)


def _real_transitions(spec: types.EnvSpec, num_envs: int, n: int, discount: float):
    """Batches of n-step transitions from random play: what an actor really writes
    (Reverb compresses chunks, so zeros would flatter the insert rate)."""
    env = envs.make_env(spec.env_id, num_envs, seed=1, num_threads=1)
    obs, _ = env.reset()
    accumulator = replay.NStepAccumulator(num_envs, n, discount)
    rng, valid, batches = np.random.default_rng(1), np.ones(num_envs, bool), []
    while len(batches) < 64:
        action = rng.integers(0, spec.num_actions, num_envs).astype(np.int32)
        next_obs, reward, terminated, truncated, _ = env.step(action)
        out = accumulator.add(obs, action, reward, terminated, truncated, next_obs, valid)
        if out is not None:
            batches.append(out)
        valid, obs = ~(valid & (terminated | truncated)), next_obs
    env.close()
    return batches


def replay_inserts(
    builder, spec: types.EnvSpec, num_envs: int, seconds: float, backend: str
) -> float:
    node = replay.node_class(backend)(functools.partial(builder_lib.replay_tables, builder, spec))
    writer = replay.connect(node).writer(dqn.builder.TABLE)
    cfg, codec = builder.config, builder.replay_layout(spec).codec
    batches = _real_transitions(spec, num_envs, cfg.n_step, cfg.discount)
    written, calls, start = 0, 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        batch = batches[calls % len(batches)]
        writer.write(codec.encode(batch), np.ones(len(batch.reward)))  # as NStepAdder does
        written, calls = written + len(batch.reward), calls + 1
    writer.flush()
    rate = written / (time.perf_counter() - start)
    writer.close()
    node.close()
    return rate


def actor_node(
    builder, spec: types.EnvSpec, num_envs: int, threads: int, seconds: float, backend: str
) -> float:
    """One ActorNode with a real replay and learner; the learner never steps."""
    graph = program.Program("actor-bench")
    with graph.group("replay"):
        replay_node = graph.add_node(
            replay.node_class(backend), functools.partial(builder_lib.replay_tables, builder, spec)
        )
    with graph.group("learner"):
        learner_node = graph.add_node(learner.LearnerNode, builder, spec, replay_node, None, 0)
    with graph.group("actor"):
        graph.add_node(
            actor.ActorNode,
            builder,
            spec,
            0,
            1,
            replay_node,
            learner_node,
            None,
            0,
            ActorSettings(num_envs=num_envs, env_threads=threads),
        )
    graph.node("learner").disable_run()
    with launchers.launch(graph, "local") as running:
        client = running.client("actor")
        while client.counters()["env_steps"] == 0:  # built, compiled, acting
            time.sleep(0.1)
        start_steps, start = client.counters()["env_steps"], time.perf_counter()
        time.sleep(seconds)
        return (client.counters()["env_steps"] - start_steps) / (time.perf_counter() - start)


def main(argv):
    del argv
    spec = envs.env_spec(_ENV.value)
    config, _ = dqn_presets.dqn_preset(presets.resolve("auto", _ENV.value))
    # A table that never rate-limits within the measurement (inserts below the minimum
    # size never wait): all inserts stay in stage 1. 1 GiB of items: FIFO past that.
    item_bytes = dqn.DQNBuilder(config).replay_layout(spec).codec.num_bytes
    capacity = min(10**7, 2**30 // item_bytes)
    config = dataclasses.replace(config, min_replay_size=10**7, max_replay_size=capacity)
    builder = dqn.DQNBuilder(config)
    num_envs, seconds = _NUM_ENVS.value, _SECONDS.value
    a = timing.raw_envpool(spec, num_envs, _THREADS.value, seconds)
    b = bare_policy(builder, spec, num_envs, seconds)
    print(f"(a) raw envpool          {a:12,.0f} env steps/s")
    print(f"(b) bare jitted policy   {b:12,.0f} observations/s")
    found = {
        "bench": "actor_throughput",
        "env": spec.env_id,
        "num_envs": num_envs,
        "env_threads": _THREADS.value,
        "raw_envpool_steps_per_s": a,
        "policy_obs_per_s": b,
    }
    for backend in _REPLAYS.value:
        c = replay_inserts(builder, spec, num_envs, seconds, backend)
        d = actor_node(builder, spec, num_envs, _THREADS.value, seconds, backend)
        ratio = d * (1 / a + 1 / b + 1 / c)
        print(f"(c) {backend:6s} inserts      {c:12,.0f} transitions/s")
        print(f"(d) actor node, {backend:6s} {d:12,.0f} env steps/s")
        print(f"ratio d*(1/a+1/b+1/c)    {ratio:12.2f}", flush=True)
        found[backend] = {
            "inserts_per_s": c,
            "actor_env_steps_per_s": d,
            "actor_over_raw_envpool": d / a,
            "ratio": ratio,
        }
    print(json.dumps(found))


if __name__ == "__main__":
    app.run(main)
