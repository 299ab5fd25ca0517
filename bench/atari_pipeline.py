"""End-to-end Atari env frames/s of a full training run against raw envpool stepping.

For each actor count, runs the whole program (actors + Reverb + learner +
monitor) on `--env` for `--seconds` and measures env frames/s over the run's
second half (start-up and compilation excluded). In the same run it measures
raw envpool stepping of the same total number of envs with random actions.
ratio = pipeline frames/s / raw frames/s. Frames = env steps x frame skip (4).

On CPU the learner's update rate, through the replay ratio, caps how fast
actors may insert: `--samples_per_insert` sets that ratio, and the learner's
updates/s is printed beside the frame rates. Last line: JSON.

  python bench/atari_pipeline.py --env=Pong-v5 --num_actors=1,2
"""

import dataclasses
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402

from agents import dqn  # noqa: E402
from bench.timing import pipeline_rates, raw_envpool  # noqa: E402
from gorila_jax import envs
from agents.dqn import presets as dqn_presets  # noqa: E402
from launch import presets  # noqa: E402

FRAME_SKIP = 4
_ENV = flags.DEFINE_string("env", "Pong-v5", "envpool Atari task id.")
_NUM_ACTORS = flags.DEFINE_list("num_actors", ["1", "2"], "Actor counts to run.")
_NUM_ENVS = flags.DEFINE_integer("num_envs", 8, "Envs per actor.")
_SECONDS = flags.DEFINE_float("seconds", 60.0, "Wall time of each training run.")
_LAUNCHER = flags.DEFINE_string("launcher", "ray", "local or ray.")
_BATCH = flags.DEFINE_integer("batch_size", 64, "Learner batch.")
_SPI = flags.DEFINE_float("samples_per_insert", 1.0, "Replay ratio the rate limiter holds.")


def pipeline_rate(num_actors: int) -> dict:
    config, _ = dqn_presets.dqn_preset(presets.resolve("auto", _ENV.value))
    config = dataclasses.replace(
        config,
        batch_size=_BATCH.value,
        samples_per_insert=_SPI.value,
        min_replay_size=1_000,
        max_replay_size=50_000,
    )
    rates = pipeline_rates(
        dqn.DQNBuilder(config),
        _ENV.value,
        _LAUNCHER.value,
        num_actors,
        _NUM_ENVS.value,
        _SECONDS.value,
    )
    updates_per_s = rates["updates_per_s"]
    return {
        "num_actors": num_actors,
        "frames_per_s": rates["env_steps_per_s"] * FRAME_SKIP,
        "updates_per_s": updates_per_s,
        # What the rate limiter lets actors insert at this update rate.
        "learner_bound_frames_per_s": updates_per_s * _BATCH.value / _SPI.value * FRAME_SKIP,
    }


def main(argv):
    del argv
    spec = envs.env_spec(_ENV.value)
    results = []
    for count in (int(n) for n in _NUM_ACTORS.value):
        run = pipeline_rate(count)
        raw = raw_envpool(spec, count * _NUM_ENVS.value, threads=count, seconds=10.0) * FRAME_SKIP
        run.update(raw_frames_per_s=raw, ratio=run["frames_per_s"] / raw)
        results.append(run)
        print(
            f"{count} actor(s): {run['frames_per_s']:,.0f} frames/s in training "
            f"({run['updates_per_s']:.1f} updates/s) vs {raw:,.0f} raw: ratio {run['ratio']:.2f}",
            flush=True,
        )
    print(
        json.dumps(
            {
                "bench": "atari_pipeline",
                "env": _ENV.value,
                "launcher": _LAUNCHER.value,
                "num_envs_per_actor": _NUM_ENVS.value,
                "batch_size": _BATCH.value,
                "samples_per_insert": _SPI.value,
                "runs": results,
            }
        )
    )


if __name__ == "__main__":
    app.run(main)
