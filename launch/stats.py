"""The statistics a sweep reports per group, over its runs (seeds).

Point estimates with stratified-bootstrap 95 % confidence intervals, as
recommended by Agarwal et al. 2021, "Deep Reinforcement Learning at the Edge
of the Statistical Precipice" (NeurIPS), computed with their `rliable`
library. A group is one environment, so its score matrix is (runs x 1 task)
and the bootstrap resamples runs.

A run's result is its final greedy return (summary.json["final_eval_return"]),
never its best evaluation: the best of noisy evaluations is biased upwards.
"""

import contextlib
import math
import os
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from rliable import library
from rliable import metrics as rliable_metrics

from gorila_jax import curves, metrics

CONFIDENCE = 0.95
DEFAULT_BOOTSTRAP_REPS = 2000
DEFAULT_BOOTSTRAP_SEED = 0


def _median(scores: np.ndarray) -> float:
    # rliable's aggregate_median is the median over tasks of per-task means,
    # which for one task is the mean; a sweep group wants the median over runs.
    return float(np.median(scores))


AGGREGATES = {
    "iqm": rliable_metrics.aggregate_iqm,
    "mean": rliable_metrics.aggregate_mean,
    "median": _median,
}


@contextlib.contextmanager
def _seeded_global_numpy(seed: int) -> Iterator[None]:
    """Seeds numpy's global generator for the block, then puts its state back.

    rliable 1.2.0's StratifiedBootstrap draws its resampled run indices from
    `np.random` itself and ignores the `random_state` it is given (that one
    only reaches arch's own draws), so a reproducible interval needs both.
    """
    state = np.random.get_state()
    np.random.seed(seed)
    try:
        yield
    finally:
        np.random.set_state(state)


def interval_estimates(
    values: Sequence[float],
    reps: int = DEFAULT_BOOTSTRAP_REPS,
    seed: int = DEFAULT_BOOTSTRAP_SEED,
) -> dict[str, dict[str, float]] | None:
    """IQM, mean and median of `values` with stratified-bootstrap 95 % CIs.

    Each aggregate draws its resamples from a fresh `RandomState(seed)`, so a
    group's numbers depend only on its own values, not on the other groups or
    the order they are computed in.

    Args:
      values: one number per run.
      reps: bootstrap replications.
      seed: seeds the resampling, for reproducible intervals.

    Returns:
      {aggregate: {"estimate", "ci_low", "ci_high"}}, or None for no values.

    Raises:
      ValueError: for a non-finite value or reps < 1.
    """
    if reps < 1:
        raise ValueError(f"bootstrap reps must be at least 1, got {reps}")
    scores = np.asarray(values, dtype=np.float64).reshape(-1, 1)
    if scores.size == 0:
        return None
    if not np.all(np.isfinite(scores)):
        raise ValueError(f"statistics need finite values, got {list(values)}")
    out = {}
    for name, aggregate in AGGREGATES.items():
        with _seeded_global_numpy(seed), warnings.catch_warnings():
            # arch deprecates RandomState in favour of Generator; rliable passes one.
            warnings.simplefilter("ignore", FutureWarning)
            point, interval = library.get_interval_estimates(
                {"group": scores},
                lambda x, aggregate=aggregate: np.array([aggregate(x)]),
                reps=reps,
                confidence_interval_size=CONFIDENCE,
                random_state=np.random.RandomState(seed),
            )
        low, high = interval["group"][:, 0]
        out[name] = {
            "estimate": float(point["group"][0]),
            "ci_low": float(low),
            "ci_high": float(high),
        }
    return out


def first_crossing(logdir: str, summary: dict[str, Any], threshold: float) -> dict[str, Any]:
    """When a run's greedy return first reached `threshold`.

    The first of its greedy evaluations (the evaluator's, then the driver's final one) at
    or above it, at the env-step count its parameters were trained on and the wall time
    the run first reached that count (`curves.evaluations_on_clock`, as the curves place
    it). `summary`: the run's, or a role's (`curves.role_summary`).

    Returns:
      {"reached": bool, "env_steps": int | None, "wall_time_s": float | None}.
    """
    rows, _ = metrics.read_csv(os.path.join(logdir, "metrics.csv"), math.inf)
    crossing = next(
        (e for e in curves.evaluations_on_clock(rows, summary) if e["eval_return"] >= threshold),
        None,
    )
    if crossing is None:
        return {"reached": False, "env_steps": None, "wall_time_s": None}
    return {
        "reached": True,
        "env_steps": int(crossing["env_steps"]),
        "wall_time_s": crossing["wall_time_s"],
    }


def group_statistics(
    runs: Sequence[dict[str, Any]],
    threshold: float | None,
    reps: int = DEFAULT_BOOTSTRAP_REPS,
    seed: int = DEFAULT_BOOTSTRAP_SEED,
) -> dict[str, Any]:
    """A group's statistics over its finished runs.

    Args:
      runs: each with "final_return" (None for a run that did not finish) and,
        with a threshold, "threshold" as `first_crossing` returns it.
      threshold: the return a run counts as solved at, or None.
      reps, seed: of the bootstrap.

    Returns:
      "num_runs", "num_finished", "final_return" (the `interval_estimates`);
      with a threshold also "fraction_at_threshold" (of finished runs, by
      their final return), "num_reached" and the time to threshold in env
      steps and wall seconds, over the runs that reached it only (keys
      "env_steps_to_threshold_over_reached", "wall_time_s_to_threshold_over_reached").
    """
    finals = [run["final_return"] for run in runs if run.get("final_return") is not None]
    out: dict[str, Any] = {
        "num_runs": len(runs),
        "num_finished": len(finals),
        "final_return": interval_estimates(finals, reps, seed),
    }
    if threshold is None:
        return out
    out["threshold"] = threshold
    out["fraction_at_threshold"] = (
        sum(value >= threshold for value in finals) / len(finals) if finals else None
    )
    # A run interrupted before its summary has "threshold": None.
    reached = [run["threshold"] for run in runs if (run.get("threshold") or {}).get("reached")]
    out["num_reached"] = len(reached)
    for unit in ("env_steps", "wall_time_s"):
        times = [crossing[unit] for crossing in reached if crossing[unit] is not None]
        out[f"{unit}_to_threshold_over_reached"] = interval_estimates(times, reps, seed)
    return out
