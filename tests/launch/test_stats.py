"""The sweep's statistics against hand computations on fixed inputs."""

import csv
import os

import numpy as np
import pytest
from rliable import library, metrics

from launch import stats

# Eight runs: the middle 50 % (after sorting) are 20, 30, 40, 50.
RETURNS = [500.0, 10.0, 40.0, 30.0, 9.0, 20.0, 50.0, 400.0]


def test_iqm_is_the_mean_of_the_middle_half_and_mean_and_median_are_the_usual_ones():
    estimates = stats.interval_estimates(RETURNS, reps=200)
    assert estimates["iqm"]["estimate"] == pytest.approx((20 + 30 + 40 + 50) / 4)
    assert estimates["mean"]["estimate"] == pytest.approx(sum(RETURNS) / len(RETURNS))
    assert estimates["median"]["estimate"] == pytest.approx((30 + 40) / 2)


def test_each_interval_brackets_its_estimate_within_the_range_of_the_runs():
    for name, e in stats.interval_estimates(RETURNS, reps=200).items():
        assert min(RETURNS) <= e["ci_low"] <= e["estimate"] <= e["ci_high"] <= max(RETURNS), name
        assert e["ci_low"] < e["ci_high"], name  # eight different runs are not a point


def test_intervals_are_reproducible_from_the_seed_and_differ_across_seeds():
    first = stats.interval_estimates(RETURNS, reps=200, seed=3)
    assert stats.interval_estimates(RETURNS, reps=200, seed=3) == first
    assert stats.interval_estimates(RETURNS, reps=200, seed=4) != first


@pytest.mark.filterwarnings("ignore:random_state is deprecated:FutureWarning")
def test_intervals_are_rliables_and_leave_numpys_global_generator_as_it_was():
    np.random.seed(123)
    expected_next = np.random.RandomState(123).random_sample()
    estimates = stats.interval_estimates(RETURNS, reps=200, seed=5)
    assert np.random.random_sample() == expected_next
    np.random.seed(5)
    point, interval = library.get_interval_estimates(
        {"g": np.array(RETURNS).reshape(-1, 1)},
        lambda x: np.array([metrics.aggregate_iqm(x)]),
        reps=200,
        random_state=np.random.RandomState(5),
    )
    iqm = estimates["iqm"]
    assert [iqm["estimate"], iqm["ci_low"], iqm["ci_high"]] == pytest.approx(
        [point["g"][0], *interval["g"][:, 0]]
    )


def test_a_single_run_has_a_point_interval_and_no_runs_have_no_statistics():
    one = stats.interval_estimates([7.0], reps=50)
    assert all(e == {"estimate": 7.0, "ci_low": 7.0, "ci_high": 7.0} for e in one.values())
    assert stats.interval_estimates([], reps=50) is None


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="finite"):
        stats.interval_estimates([1.0, float("nan")])
    with pytest.raises(ValueError, match="reps"):
        stats.interval_estimates([1.0], reps=0)


def _metrics(logdir, rows):
    with open(os.path.join(logdir, "metrics.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["wall_time_s", "env_steps", "eval_return"])
        writer.writeheader()
        writer.writerows(rows)


def test_time_to_threshold_is_the_first_crossing_not_the_best_or_the_last(tmp_path):
    rows = [
        {"wall_time_s": 1.0, "env_steps": 100, "eval_return": "nan"},
        {"wall_time_s": 2.0, "env_steps": 200, "eval_return": 80.0},
        {"wall_time_s": 3.0, "env_steps": 300, "eval_return": 120.0},
        {"wall_time_s": 4.0, "env_steps": 400, "eval_return": 200.0},
    ]
    _metrics(tmp_path, rows)
    summary = {
        "env_steps": 500,
        "wall_time_s": 5.0,
        "evaluations": [
            {"env_steps": 180, "eval_return": 80.0},
            {"env_steps": 290, "eval_return": 120.0},
            {"env_steps": 390, "eval_return": 200.0},
            # The evaluator's last one, during the stop: no metrics row has it.
            {"env_steps": 500, "eval_return": 300.0},
        ],
        "final_eval_return": 350.0,
    }
    # The parameters evaluated had 290 env steps behind them: the run's clock at 290.
    crossing = stats.first_crossing(str(tmp_path), summary, 100.0)
    assert crossing == {"reached": True, "env_steps": 290, "wall_time_s": 2.9}
    assert stats.first_crossing(str(tmp_path), summary, 250.0)["wall_time_s"] == 5.0
    # The driver's final evaluation counts: a run that ends above it reached it.
    assert stats.first_crossing(str(tmp_path), summary, 320.0)["env_steps"] == 500
    never = stats.first_crossing(str(tmp_path), summary, 500.0)
    assert never == {"reached": False, "env_steps": None, "wall_time_s": None}
    # Resumed once more (a sweep re-run after its summary.json was lost): its clock goes
    # on and rows at the end come again, but it reached the end when it did before.
    _metrics(tmp_path, [*rows, {"wall_time_s": 5.0, "env_steps": 500, "eval_return": 300.0}])
    again = {**summary, "wall_time_s": 31.0}
    assert stats.first_crossing(str(tmp_path), again, 250.0)["wall_time_s"] == 5.0


def test_group_statistics_count_final_returns_and_time_only_runs_that_reached():
    runs = [
        {
            "final_return": 500.0,
            "threshold": {"reached": True, "env_steps": 1000, "wall_time_s": 10.0},
        },
        {
            "final_return": 480.0,
            "threshold": {"reached": True, "env_steps": 3000, "wall_time_s": 30.0},
        },
        # Reached 475 during training but ended below it: the result is the final return.
        {
            "final_return": 300.0,
            "threshold": {"reached": True, "env_steps": 2000, "wall_time_s": 20.0},
        },
        {
            "final_return": 100.0,
            "threshold": {"reached": False, "env_steps": None, "wall_time_s": None},
        },
        {"final_return": None},  # failed
        {"final_return": None, "threshold": None},  # interrupted before its summary
    ]
    group = stats.group_statistics(runs, threshold=475.0, reps=200)
    assert (group["num_runs"], group["num_finished"], group["num_reached"]) == (6, 4, 3)
    assert group["fraction_at_threshold"] == pytest.approx(2 / 4)
    finals = np.array([500.0, 480.0, 300.0, 100.0])
    assert group["final_return"]["mean"]["estimate"] == pytest.approx(finals.mean())
    steps = group["env_steps_to_threshold_over_reached"]
    assert steps["mean"]["estimate"] == pytest.approx(2000.0)
    assert steps["median"]["estimate"] == pytest.approx(2000.0)
    assert group["wall_time_s_to_threshold_over_reached"]["mean"]["estimate"] == pytest.approx(20.0)
    assert "threshold" not in stats.group_statistics(runs, threshold=None, reps=50)
