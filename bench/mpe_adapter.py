"""What the multi-agent adapter (gorila_jax/multiagent.py) costs over mpe2's own env.

In this one run, agent steps/s (rows: one agent acting once) of random actions
through `envs.make_env` (the adapter, as actors step it: send then recv) and
through the same number of mpe2 parallel envs stepped with action dicts in a
loop, restarting each when it ends; the ratio of the two. Last line: JSON.

  python bench/mpe_adapter.py --env=mpe/simple_spread_v3 --num_envs=8
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

from bench import timing  # noqa: E402
from gorila_jax import envs, multiagent  # noqa: E402

flags.DEFINE_string("env", "mpe/simple_spread_v3", "an MPE task of one role")
flags.DEFINE_integer("num_envs", 8, "copies of the task")
flags.DEFINE_float("seconds", 5.0, "time per measurement")
FLAGS = flags.FLAGS


def _raw_rate(env_id: str, num_envs: int, rows: int, seconds: float) -> float:
    copies = [multiagent.make_task(env_id) for _ in range(num_envs)]
    for i, copy in enumerate(copies):
        copy.reset(seed=i)
    rng = np.random.default_rng(0)

    def step():
        for copy in copies:
            copy.step(
                {agent: int(rng.integers(copy.action_space(agent).n)) for agent in copy.agents}
            )
            if not copy.agents:
                copy.reset()

    try:
        return timing.timed(step, seconds, rows)
    finally:
        for copy in copies:
            copy.close()


def main(_):
    spec = envs.env_spec(FLAGS.env)
    rows = FLAGS.num_envs * spec.agents_per_env
    env = envs.make_env(FLAGS.env, FLAGS.num_envs, seed=0)
    env.reset()
    rng = np.random.default_rng(0)

    def step():
        env.send(rng.integers(0, spec.num_actions, rows).astype(np.int32))
        env.recv()

    try:
        adapter = timing.timed(step, FLAGS.seconds, rows)
    finally:
        env.close()
    raw = _raw_rate(FLAGS.env, FLAGS.num_envs, rows, FLAGS.seconds)
    result = {
        "env": FLAGS.env,
        "num_envs": FLAGS.num_envs,
        "rows": rows,
        "adapter_agent_steps_per_s": round(adapter),
        "raw_agent_steps_per_s": round(raw),
        "adapter_vs_raw": round(adapter / raw, 3),
    }
    print(
        f"{FLAGS.env}, {FLAGS.num_envs} copies ({rows} rows): agent steps/s adapter "
        f"{adapter:,.0f}, raw mpe2 {raw:,.0f} ({result['adapter_vs_raw']}x)"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    app.run(main)
