"""The same agent on the same task two ways: on gymnax's CartPole-v1 in one compiled loop
(`--launcher=anakin`) and through actors and replay (`--launcher=local`), one after the
other, per seed.

Both take the agent's `cartpole` preset (PPO: 2 actors x 8 envs, 64-step chunks, a batch
of 16; DQN: its prioritized replay, rate and n-step returns) at the same budget (the
preset's by default), with evaluations every `--eval_interval_s`. Prints, per way and
seed: env steps/s and updates/s over the whole run (compilation included), env steps/s
from its first logged env steps on (compilation left out), wall time to the first greedy
evaluation of at least 475 (None: no evaluation during the run reached it), and the final
greedy return; then each figure's median over seeds and Anakin's speed over the actors'.
Last line: JSON.

  python bench/anakin_two_ways.py --agent=ppo --seeds=0,1,2,3,4
  python bench/anakin_two_ways.py --agent=dqn --seeds=0,1,2
"""

import csv
import json
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402

from agents import dqn, ppo  # noqa: E402
from agents.dqn import presets as dqn_presets  # noqa: E402
from agents.ppo import presets as ppo_presets  # noqa: E402
from gorila_jax.run import experiment  # noqa: E402

_SEEDS = flags.DEFINE_list("seeds", ["0", "1", "2", "3", "4"], "Seeds; each runs both ways.")
_AGENT = flags.DEFINE_enum("agent", "ppo", ["ppo", "dqn"], "The agent, with its cartpole preset.")
_STEPS = flags.DEFINE_integer("total_env_steps", 0, "Budget of every run; 0: the preset's.")
_EVAL_S = flags.DEFINE_float("eval_interval_s", 1.0, "Seconds between greedy evaluations.")
_SOLVED = 475.0
WAYS = ("anakin", "local")


def one_run(way: str, seed: int) -> dict:
    preset, make = {
        "ppo": (ppo_presets.ppo_preset, ppo.PPOBuilder),
        "dqn": (dqn_presets.dqn_preset, dqn.DQNBuilder),
    }[_AGENT.value]
    config, settings = preset("cartpole")
    with tempfile.TemporaryDirectory() as logdir:
        cfg = experiment.ExperimentConfig(
            **{
                **settings,
                "env_id": "gymnax/CartPole-v1",
                "launcher": way,
                "logdir": logdir,
                "seed": seed,
                "total_env_steps": _STEPS.value or settings["total_env_steps"],
                "eval_interval_s": _EVAL_S.value,
                "num_learner_devices": 1,
            }
        )
        summary = experiment.run_experiment(make(config), cfg)
        rows = list(csv.DictReader(open(os.path.join(logdir, "metrics.csv"))))
    moving = [row for row in rows if float(row["env_steps"]) > 0]
    steady = None  # env steps/s from the first row with env steps on: compilation left out
    if len(moving) > 1 and float(moving[-1]["wall_time_s"]) > float(moving[0]["wall_time_s"]):
        steady = (float(moving[-1]["env_steps"]) - float(moving[0]["env_steps"])) / (
            float(moving[-1]["wall_time_s"]) - float(moving[0]["wall_time_s"])
        )
    solved = [
        float(row["wall_time_s"])
        for row in rows
        if row["eval_return"] not in ("", "nan") and float(row["eval_return"]) >= _SOLVED
    ]
    return {
        "env_steps_per_s": summary["env_steps_per_s"],
        "learner_steps_per_s": summary["learner_steps_per_s"],
        "steady_env_steps_per_s": steady,
        "wall_time_s": summary["wall_time_s"],
        "time_to_475_s": solved[0] if solved else None,
        "final_eval_return": summary["final_eval_return"],
    }


def _median(values: list) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def main(argv: list[str]) -> None:
    del argv
    runs: dict[str, list[dict]] = {way: [] for way in WAYS}
    for seed in map(int, _SEEDS.value):
        for way in WAYS:
            result = one_run(way, seed)
            runs[way].append(result)
            print(f"{way:>6} seed {seed}: {json.dumps(result)}", flush=True)
    medians = {
        way: {name: _median([r[name] for r in results]) for name in results[0]}
        for way, results in runs.items()
    }
    for way, figures in medians.items():
        print(f"{way:>6} medians: {json.dumps(figures)}")
    speedup = {
        name: medians["anakin"][name] / medians["local"][name]
        for name in ("env_steps_per_s", "learner_steps_per_s", "steady_env_steps_per_s")
        if medians["anakin"][name] and medians["local"][name]
    }
    print(f"anakin over the actors: {json.dumps(speedup)}")
    print(json.dumps({"medians": medians, "anakin_speedup": speedup, "runs": runs}))


if __name__ == "__main__":
    app.run(main)
