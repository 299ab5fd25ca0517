"""End-to-end env steps/s of PPO on an Atari game against raw envpool stepping, in one run.

For each actor count, runs the whole PPO program (actors + Reverb queue +
learner + monitor) on `--env` for `--seconds` and measures env steps/s over
the run's second half (start-up and compilation excluded). In the same run it
measures raw envpool stepping of the same total number of envs with random
actions. ratio = pipeline env steps/s / raw env steps/s (frames = 4 x steps).

PPO is on-policy: the queue holds `--queue_batches` learner batches, so actors
run at most at the learner's pace. The learner-bound rate (updates/s x steps
per update) is printed beside the measured one. Last line: JSON.

  python bench/ppo_pipeline.py --env=Pong-v5 --num_actors=1,2 --seconds=120
"""

import dataclasses
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402

from agents import ppo  # noqa: E402
from bench.timing import pipeline_rates, raw_envpool  # noqa: E402
from gorila_jax import envs
from agents.ppo import presets as ppo_presets  # noqa: E402
from launch import presets  # noqa: E402

_ENV = flags.DEFINE_string("env", "Pong-v5", "envpool Atari task id.")
_NUM_ACTORS = flags.DEFINE_list("num_actors", ["1", "2"], "Actor counts to run.")
_NUM_ENVS = flags.DEFINE_integer("num_envs", 8, "Envs per actor.")
_SECONDS = flags.DEFINE_float("seconds", 120.0, "Wall time of each training run.")
_LAUNCHER = flags.DEFINE_string("launcher", "ray", "local or ray.")
_LENGTH = flags.DEFINE_integer("trajectory_length", 128, "Steps per chunk.")
_BATCH = flags.DEFINE_integer("batch_size", 8, "Chunks per actor in each learner batch.")
_EPOCHS = flags.DEFINE_integer("num_epochs", 4, "Passes over each batch.")
_MINIBATCHES = flags.DEFINE_integer("num_minibatches", 4, "Minibatches per pass.")
_QUEUE = flags.DEFINE_integer("queue_batches", 2, "Learner batches the queue holds.")


def pipeline_rate(num_actors: int) -> dict:
    config, _ = ppo_presets.ppo_preset(presets.resolve("auto", _ENV.value))
    config = dataclasses.replace(
        config,
        num_actors=num_actors,
        trajectory_length=_LENGTH.value,
        batch_size=_BATCH.value,
        num_epochs=_EPOCHS.value,
        num_minibatches=_MINIBATCHES.value,
        queue_batches=_QUEUE.value,
    )
    rates = pipeline_rates(
        ppo.PPOBuilder(config),
        _ENV.value,
        _LAUNCHER.value,
        num_actors,
        _NUM_ENVS.value,
        _SECONDS.value,
    )
    updates, last = rates["updates_per_s"], rates["last_row"]
    steps_per_update = config.global_batch_size * config.trajectory_length
    return {
        "num_actors": num_actors,
        "env_steps_per_s": rates["env_steps_per_s"],
        "updates_per_s": updates,
        "steps_per_update": steps_per_update,
        # What the queue lets actors produce at this update rate.
        "learner_bound_env_steps_per_s": updates * steps_per_update,
        "policy_lag_mean": float(last.get("policy_lag_mean") or "nan"),
    }


def main(argv):
    del argv
    spec = envs.env_spec(_ENV.value)
    results = []
    for count in (int(n) for n in _NUM_ACTORS.value):
        run = pipeline_rate(count)
        raw = raw_envpool(spec, count * _NUM_ENVS.value, threads=count, seconds=10.0)
        run.update(raw_env_steps_per_s=raw, ratio=run["env_steps_per_s"] / raw)
        results.append(run)
        print(
            f"{count} actor(s): {run['env_steps_per_s']:,.0f} env steps/s in training "
            f"({run['updates_per_s']:.3f} updates/s of {run['steps_per_update']} steps) vs "
            f"{raw:,.0f} raw: ratio {run['ratio']:.3f}",
            flush=True,
        )
    print(
        json.dumps(
            {
                "bench": "ppo_pipeline",
                "env": _ENV.value,
                "launcher": _LAUNCHER.value,
                "num_envs_per_actor": _NUM_ENVS.value,
                "trajectory_length": _LENGTH.value,
                "batch_size_per_actor": _BATCH.value,
                "num_epochs": _EPOCHS.value,
                "num_minibatches": _MINIBATCHES.value,
                "runs": results,
            }
        )
    )


if __name__ == "__main__":
    app.run(main)
