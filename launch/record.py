"""Records demonstration episodes from a run's checkpoint, for `--demos` (DQfD-style learning).

Examples:
  python -m launch.record --logdir=runs/cartpole --episodes=20 --out=demos/cartpole
  python -m launch.train --env=CartPole-v1 --demos=demos/cartpole --config.demo_fraction=0.25

The agent is rebuilt from `<logdir>/config.json` and its newest checkpoint (or
`--step`'s), and plays `--episodes` whole episodes with its evaluation policy in
the env as actors see it. The files are the documented demonstration format
(gorila_jax/demonstrations.py, docs/demonstrations.md), which recordings of a
person, or of any other policy (`demonstrations.record` takes a callable), can
be written in as well. `--min_return` keeps only episodes that reach it. The
last line printed is JSON.
"""

import sys

import numpy as np
from absl import app, flags

from gorila_jax import demonstrations
from launch import trained as trained_lib

_LOGDIR, _EPSILON, _STEP = trained_lib.define_run_flags("record")
_OUT = flags.DEFINE_string(
    "out", None, "An empty (or new) directory for the episodes.", required=True
)
_EPISODES = flags.DEFINE_integer("episodes", 10, "Episodes to record.", lower_bound=1)
_SEED = flags.DEFINE_integer("seed", None, "Env and policy seed; unset: the run's seed + 2.")
_MIN_RETURN = flags.DEFINE_float(
    "min_return", None, "Keep only episodes whose return reaches this (unset: keep all)."
)
_MAX_TRIES = 10  # rounds of `--episodes` episodes played before --min_return gives up


def record_run(
    logdir: str,
    out: str,
    episodes: int,
    epsilon: float | None,
    seed: int | None,
    step: int | None,
    min_return: float | None,
) -> dict:
    """Records from the run in `logdir` into `out`; returns the report the JSON line holds."""
    trained = trained_lib.restore_policy(logdir, epsilon, step)
    # The run's own evaluations play seed + 1; demonstrations come from other episodes.
    seed = trained.record["experiment"]["seed"] + 2 if seed is None else seed
    act = demonstrations.policy_actions(trained.builder, trained.spec, trained.params, seed)
    kept: list[demonstrations.Episode] = []
    played = 0
    for attempt in range(_MAX_TRIES):
        batch = demonstrations.record(trained.spec.env_id, act, episodes, seed + attempt)
        played += len(batch)
        kept += [e for e in batch if min_return is None or e.rewards.sum() >= min_return]
        if len(kept) >= episodes:
            break
    if len(kept) < episodes:
        raise ValueError(
            f"only {len(kept)} of {played} episodes reached --min_return={min_return}; "
            f"{episodes} wanted"
        )
    kept = kept[:episodes]
    source = f"{logdir} learner step {trained.learner_step}, epsilon {epsilon}, seed {seed}"
    demonstrations.write(out, kept, trained.spec.env_id, source)
    returns = [float(e.rewards.sum()) for e in kept]
    return {
        "out": out,
        "env_id": trained.spec.env_id,
        "logdir": logdir,
        "learner_step": trained.learner_step,
        "episodes": len(kept),
        "episodes_played": played,
        "steps": int(sum(e.steps for e in kept)),
        "mean_return": float(np.mean(returns)),
        "returns": returns,
    }


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        sys.exit(f"error: unexpected arguments {argv[1:]}")
    trained_lib.report_or_exit(
        lambda: record_run(
            _LOGDIR.value,
            _OUT.value,
            _EPISODES.value,
            _EPSILON.value,
            _SEED.value,
            _STEP.value,
            _MIN_RETURN.value,
        ),
        lambda report: (
            f"{report['env_id']}: {report['episodes']} episodes ({report['steps']:,} steps, "
            f"mean return {report['mean_return']:.2f}) from learner step "
            f"{report['learner_step']:,} written to {report['out']}"
        ),
    )


if __name__ == "__main__":
    app.run(main, flags_parser=trained_lib.parse_flags)
