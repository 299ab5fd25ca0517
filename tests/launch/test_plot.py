"""`python -m launch.plot` and gorila_jax/plots.py: the lines drawn are the runs' numbers,
aggregated over seeds as documented, read back from the figure; clear errors."""

import dataclasses
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from agents import dqn
from gorila_jax import curves, metrics, plots
from gorila_jax.run import experiment

from tests import REPO

ENV_STEPS_PER_ROW, ENV_STEPS_PER_S = 1_000, 250.0
EVAL_EVERY_ROWS = 2


def _plot(*flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "launch.plot", *flags],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _write_run(
    logdir,
    num_rows: int,
    offset: float,
    slope: float,
    gorila: bool = False,
    batch_size: int = 64,
) -> None:
    """A run as run_experiment leaves it, written by the real MetricsLogger: greedy and
    training return `offset + slope * env_steps`, 10 updates per row, evaluations every
    other row and a final one; `gorila` runs log Gorila counters and no batch size."""
    logger = metrics.MetricsLogger(str(logdir))
    evaluations = []
    for i in range(num_rows):
        env_steps = i * ENV_STEPS_PER_ROW
        row = {
            "wall_time_s": env_steps / ENV_STEPS_PER_S,
            "env_steps": env_steps,
            "episodes": i * 5,
            "learner_steps": i * 10,
            # No episode has ended by the first row: its mean is NaN, as in a real run.
            "mean_return": math.nan if i == 0 else offset + slope * env_steps,
            "eval_return": evaluations[-1]["eval_return"] if evaluations else math.nan,
            "env_steps_per_s": ENV_STEPS_PER_S,
            "learner_steps_per_s": 2.5,
            "num_actors": 1,
        }
        if gorila:
            row.update(
                gradients_applied=i * 9,
                dropped_stale=i,
                dropped_outlier=0,
                dropped_nonfinite=0,
            )
        elif i:  # the learner reports a batch size once it has stepped
            row.update(loss=1.0, batch_size=batch_size)
        logger.write(row)
        if i % EVAL_EVERY_ROWS == EVAL_EVERY_ROWS - 1:
            evaluations.append(
                {
                    "env_steps": env_steps,
                    "learner_steps": i * 10,
                    "param_version": i * 10,
                    "eval_return": offset + slope * env_steps,
                    "num_episodes": 10,
                    "unix_time": 1.7e9 + i,
                }
            )
    logger.close()
    last_env_steps = (num_rows - 1) * ENV_STEPS_PER_ROW
    summary = {
        "env_id": "CartPole-v1",
        "stop_reason": "total_env_steps reached",
        "env_steps": last_env_steps,
        "episodes": (num_rows - 1) * 5,
        "learner_steps": (num_rows - 1) * 10,
        "wall_time_s": last_env_steps / ENV_STEPS_PER_S,
        "final_eval_return": offset + slope * last_env_steps,
        "final_eval_episodes": 10,
        "evaluations": evaluations,
        "restarts": [],
        "experiment": {"env_id": "CartPole-v1"},
        "agent_config": {"batch_size": batch_size},
    }
    with open(os.path.join(logdir, "summary.json"), "w") as f:
        json.dump(summary, f)


# The seeds of a sweep group: (offset, slope) of each run's return.
SEEDS = [(10.0, 0.010), (30.0, 0.002), (0.0, 0.020), (50.0, 0.005)]


@pytest.fixture(scope="module")
def single_run(tmp_path_factory):
    logdir = tmp_path_factory.mktemp("baseline")
    _write_run(logdir, num_rows=11, offset=5.0, slope=0.01)
    return str(logdir)


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory):
    """A sweep folder without sweep.json: one group of 3 seeds, one of 4."""
    root = tmp_path_factory.mktemp("sweep")
    for group, seeds in (("lr=1e-3", SEEDS[:3]), ("lr=5e-4", SEEDS)):
        for seed, (offset, slope) in enumerate(seeds):
            _write_run(root / group / f"seed={seed}", num_rows=11, offset=offset, slope=slope)
    return str(root)


def _pixels(columns: int, rows: int = 1) -> tuple[int, int]:
    """The size of a figure of that many panels, as written."""
    width, height = columns * plots.PANEL_WIDTH_IN, rows * plots.PANEL_HEIGHT_IN
    return round(width * plots.DPI), round(height * plots.DPI)


def _lines(ax, label_start: str):
    return [line for line in ax.get_lines() if line.get_label().startswith(label_start)]


def test_two_logdirs_draw_a_line_per_group_and_series_with_bands_over_seeds(
    single_run, sweep_dir, tmp_path
):
    out = str(tmp_path / "curves.png")
    fig = plots.plot_logdirs([single_run, sweep_dir], out)

    env_steps_ax, wall_ax = fig.axes
    assert env_steps_ax.get_xlabel() == "env steps" and wall_ax.get_xlabel() == "wall-clock seconds"
    for ax in fig.axes:
        # 3 groups (the run, 2 sweep groups) x greedy and training.
        assert len(ax.get_lines()) == 6
        # A band for each series of the two swept groups; a single run has none.
        assert len(ax.collections) == 4
    labels = [line.get_label() for line in env_steps_ax.get_lines()]
    assert f"{single_run} greedy (1 run)" in labels
    assert "lr=1e-3 greedy (IQM of 3 runs, 95% bootstrap CI)" in labels
    assert "lr=5e-4 training (IQM of 4 runs, 95% bootstrap CI)" in labels
    with Image.open(out) as image:
        assert image.size == _pixels(2)


def test_the_command_line_writes_the_figure_and_merges_groups_of_one_label(
    single_run, sweep_dir, tmp_path
):
    out = tmp_path / "curves.png"
    seed_dirs = [os.path.join(sweep_dir, "lr=5e-4", f"seed={seed}") for seed in range(2)]
    result = _plot(
        *(f"--logdir={d}" for d in seed_dirs),
        "--label=two seeds",
        "--label=two seeds",
        "--x=env_steps",
        f"--out={out}",
    )
    assert result.returncode == 0, result.stderr
    with Image.open(out) as image:
        image.load()
        assert image.size == _pixels(1)

    # The same call in-process, to read the lines back: one group of the two runs.
    fig = plots.plot_logdirs(seed_dirs, str(out), ("env_steps",), labels=["two seeds"] * 2)
    (ax,) = fig.axes
    labels = [line.get_label() for line in ax.get_lines()]
    assert labels == [
        "two seeds greedy (IQM of 2 runs, runs' 2.5-97.5%)",
        "two seeds training (IQM of 2 runs, runs' 2.5-97.5%)",
    ]


def test_the_iqm_line_is_the_runs_statistic_at_each_grid_point(sweep_dir, tmp_path):
    fig = plots.plot_logdirs([sweep_dir], str(tmp_path / "c.png"), ("env_steps",))
    (greedy,) = _lines(fig.axes[0], "lr=5e-4 greedy")
    x, iqm = greedy.get_xdata(), greedy.get_ydata()
    for k in (0, 57, len(x) - 1):
        # Each seed's greedy return is offset + slope * env steps; the IQM of 4 runs is
        # the mean of the middle 2.
        returns = sorted(offset + slope * x[k] for offset, slope in SEEDS)
        assert iqm[k] == pytest.approx((returns[1] + returns[2]) / 2)

    fig = plots.plot_logdirs([sweep_dir], str(tmp_path / "c.png"), ("wall_time_s",), stat="mean")
    (training,) = _lines(fig.axes[0], "lr=5e-4 training")
    assert training.get_label() == "lr=5e-4 training (mean of 4 runs, 95% bootstrap CI)"
    x, mean = training.get_xdata(), training.get_ydata()
    k = 101
    returns = [offset + slope * x[k] * ENV_STEPS_PER_S for offset, slope in SEEDS]
    assert mean[k] == pytest.approx(sum(returns) / 4)


def _linear_runs(seeds, end: float = 10_000.0):
    x = np.linspace(0.0, end, 11)
    return [(x, offset + slope * x) for offset, slope in seeds]


def test_two_runs_band_is_their_2_5_to_97_5_percentiles_and_more_a_seeded_bootstrap():
    pair = curves.aggregate(_linear_runs(SEEDS[:2]), "iqm")
    a, b = (offset + slope * pair.x for offset, slope in SEEDS[:2])
    low, high = np.minimum(a, b), np.maximum(a, b)
    assert pair.band_kind == "percentile"
    np.testing.assert_allclose(pair.band[0], low + 0.025 * (high - low))
    np.testing.assert_allclose(pair.band[1], low + 0.975 * (high - low))

    four = curves.aggregate(_linear_runs(SEEDS), "iqm")
    again = curves.aggregate(_linear_runs(SEEDS), "iqm")
    assert four.band_kind == "bootstrap" and four.num_runs == 4
    np.testing.assert_array_equal(four.band[0], again.band[0])  # the same figure each time
    runs = np.stack([offset + slope * four.x for offset, slope in SEEDS])
    # Every resample's IQM lies within the runs; the interval brackets the estimate.
    assert np.all(runs.min(axis=0) <= four.band[0] + 1e-9)
    assert np.all(four.band[1] <= runs.max(axis=0) + 1e-9)
    assert np.all((four.band[0] <= four.center + 1e-9) & (four.center <= four.band[1] + 1e-9))
    assert np.any(four.band[1] - four.band[0] > 0)

    single = curves.aggregate(_linear_runs(SEEDS[:1]), "mean")
    assert single.band is None and single.band_kind is None


def test_runs_of_different_lengths_are_drawn_only_where_every_run_has_data(tmp_path):
    short, long = tmp_path / "g" / "seed=0", tmp_path / "g" / "seed=1"
    _write_run(short, num_rows=6, offset=0.0, slope=0.01)  # ends at 5,000 env steps
    _write_run(long, num_rows=10, offset=20.0, slope=0.01)  # ends at 9,000
    fig = plots.plot_logdirs([str(tmp_path)], str(tmp_path / "c.png"))
    env_steps_ax, wall_ax = fig.axes
    for label in ("g greedy", "g training"):
        (line,) = _lines(env_steps_ax, label)
        assert line.get_xdata().max() == 5_000
        # Two runs, 20 apart everywhere: their IQM (the mean of 2) is 10 above the short.
        np.testing.assert_allclose(line.get_ydata(), 10.0 + 0.01 * line.get_xdata())
        (line,) = _lines(wall_ax, label)
        assert line.get_xdata().max() == 5_000 / ENV_STEPS_PER_S
    # Training starts with the first finished episodes (row 1); greedy with the first eval.
    (training,) = _lines(env_steps_ax, "g training")
    (greedy,) = _lines(env_steps_ax, "g greedy")
    assert training.get_xdata().min() == ENV_STEPS_PER_ROW
    assert greedy.get_xdata().min() == EVAL_EVERY_ROWS * ENV_STEPS_PER_ROW - ENV_STEPS_PER_ROW


def test_throughput_and_gorila_panels_draw_the_logged_rates_and_replay_ratio(tmp_path, capsys):
    sync, gorila = tmp_path / "sync", tmp_path / "gorila"
    _write_run(sync, num_rows=6, offset=0.0, slope=0.01, batch_size=64)
    _write_run(gorila, num_rows=6, offset=0.0, slope=0.01, gorila=True, batch_size=32)
    panels = ["return", "env_steps_per_s", "learner_steps_per_s", "replay_ratio", "gorila"]
    fig = plots.plot_logdirs(
        [str(sync), str(gorila)], str(tmp_path / "c.png"), ("env_steps",), panels
    )
    ret, env_rate, update_rate, replay_ratio, gorila_ax = fig.axes
    assert [ax.get_ylabel() for ax in fig.axes] == [plots.PANELS[p].ylabel for p in panels]
    for line in env_rate.get_lines():
        np.testing.assert_allclose(line.get_ydata(), ENV_STEPS_PER_S)
    # 10 updates of a batch per 1,000 env steps: the sync run's batch from metrics.csv,
    # the Gorila run's (no batch_size column) from its config.
    (sync_ratio,) = _lines(replay_ratio, str(sync))
    (gorila_ratio,) = _lines(replay_ratio, str(gorila))
    np.testing.assert_allclose(sync_ratio.get_ydata(), 10 * 64 / ENV_STEPS_PER_ROW)
    np.testing.assert_allclose(gorila_ratio.get_ydata(), 10 * 32 / ENV_STEPS_PER_ROW)
    # Only the Gorila run has the applied and dropped counters.
    applied, dropped = gorila_ax.get_lines()
    assert applied.get_label().startswith(f"{gorila} applied")
    np.testing.assert_allclose(dropped.get_ydata(), applied.get_ydata() / 9)

    fig = plots.plot_logdirs(
        [str(sync)], str(tmp_path / "c.png"), ("env_steps",), ["return", "gorila"]
    )
    assert [ax.get_ylabel() for ax in fig.axes] == ["return"]
    assert "no run logged what panel 'gorila' shows; left out" in capsys.readouterr().out


def test_an_unknown_panel_is_an_error_that_lists_the_valid_ones(single_run, tmp_path):
    result = _plot(f"--logdir={single_run}", "--panels=return,updates", f"--out={tmp_path}/c.png")
    assert result.returncode == 1
    assert (
        result.stderr.strip() == f"error: unknown panel updates; valid: {', '.join(plots.PANELS)}"
    )
    assert not (tmp_path / "c.png").exists()


def test_a_logdir_without_runs_and_an_unreadable_csv_are_named_in_the_error(single_run, tmp_path):
    empty = tmp_path / "empty"
    (empty / "not_a_run").mkdir(parents=True)
    result = _plot(f"--logdir={single_run}", f"--logdir={empty}", f"--out={tmp_path}/c.png")
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"error: {empty} holds no run: no metrics.csv in it or in any folder under it"
    )

    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "metrics.csv").write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe\x00")
    result = _plot(f"--logdir={broken}", f"--out={tmp_path}/c.png")
    assert result.returncode == 1
    assert result.stderr.startswith(f"error: cannot read {broken}/metrics.csv: ")

    (broken / "metrics.csv").write_text("step,value\n1,2\n")
    with pytest.raises(ValueError, match="metrics.csv: it has no env_steps column"):
        curves.read_run(str(broken))
    with pytest.raises(ValueError, match="2 labels for 1 logdirs"):
        plots.plot_logdirs([single_run], str(tmp_path / "c.png"), labels=["a", "b"])


def test_a_run_whose_last_row_a_crash_cut_is_drawn_without_it_and_a_warning(tmp_path):
    logdir = tmp_path / "crashed"
    _write_run(logdir, num_rows=11, offset=5.0, slope=0.01)
    os.remove(logdir / "summary.json")  # the run died: no summary
    csv_path = logdir / "metrics.csv"
    whole = csv_path.read_bytes()
    csv_path.write_bytes(whole[: whole.rindex(b",", 0, len(whole) - 1) - 1])  # mid-row
    rows = curves.read_run(str(logdir)).rows
    assert [row["env_steps"] for row in rows] == [i * ENV_STEPS_PER_ROW for i in range(10)]
    result = _plot(f"--logdir={logdir}", f"--out={tmp_path}/c.png")
    assert result.returncode == 0, result.stderr
    assert "metrics.csv: its last row was cut short (a crash while writing it?): left out" in (
        result.stderr
    )
    assert (tmp_path / "c.png").stat().st_size > 0


def test_a_sweep_json_names_the_groups_and_runs_without_metrics_are_skipped(tmp_path, capsys):
    for name, (offset, slope) in zip(("a/0", "a/1", "b/0"), SEEDS):
        _write_run(tmp_path / name, num_rows=4, offset=offset, slope=slope)
    listed = [
        {"logdir": "a/0", "group": "lr=1e-3"},
        {"logdir": str(tmp_path / "a" / "1"), "group": "lr=1e-3"},
        {"logdir": "b/0", "group": "lr=5e-4"},
        {"logdir": "c/0", "group": "lr=5e-4"},  # not started yet
    ]
    (tmp_path / "sweep.json").write_text(json.dumps({"runs": listed}))
    groups = curves.find_groups(str(tmp_path), label="new")
    assert groups == {
        "new/lr=1e-3": [str(tmp_path / "a" / "0"), str(tmp_path / "a" / "1")],
        "new/lr=5e-4": [str(tmp_path / "b" / "0")],
    }
    assert "1 of 4 runs have no metrics yet" in capsys.readouterr().out

    (tmp_path / "sweep.json").write_text(json.dumps({"runs": [{"group": "x"}]}))
    with pytest.raises(ValueError, match="sweep.json: expected"):
        curves.find_groups(str(tmp_path))


def test_write_run_curves_writes_a_small_png_of_greedy_and_training_return(tmp_path):
    logdir = tmp_path / "run"
    _write_run(logdir, num_rows=1_000, offset=0.0, slope=0.001)
    path = plots.write_run_curves(str(logdir))
    assert path == str(logdir / "curves.png")
    with Image.open(path) as image:
        image.load()
        assert image.format == "PNG"
        assert image.size == _pixels(2)
    assert os.path.getsize(path) < 150 * 1024

    with pytest.raises(FileNotFoundError, match="has no metrics.csv"):
        plots.write_run_curves(str(tmp_path / "nothing"))


def test_sweep_figure_marks_each_groups_iqm_over_its_final_returns(tmp_path):
    final_returns = {"lr=1e-3": [100.0, 200.0, 450.0, 480.0, 500.0], "lr=5e-4": [300.0, 500.0]}
    fig = plots.sweep_figure(final_returns, threshold=475.0)
    (ax,) = fig.axes
    iqm_markers = [
        line for line in ax.get_lines() if line.get_marker() == "D" and line.get_xdata().size
    ]
    # IQM of 5 = the mean of the middle 3 (25 % cut: 1 from each end); of 2 = their mean.
    assert [m.get_xdata()[0] for m in iqm_markers] == pytest.approx([(200 + 450 + 480) / 3, 400])
    assert [t.get_text() for t in ax.get_yticklabels()] == ["lr=1e-3 (n=5)", "lr=5e-4 (n=2)"]
    assert "threshold 475" in [t.get_text() for t in ax.get_legend().get_texts()]

    path = tmp_path / "sweep.png"
    plots.write_sweep_figure(final_returns, str(path))
    with Image.open(path) as image:
        image.load()
        assert image.format == "PNG"
    with pytest.raises(ValueError, match="'lr=1e-3' has final returns that are not numbers"):
        plots.write_sweep_figure({"lr=1e-3": [1.0, None]}, str(path))


# A real (tiny) training run: the files read are run_experiment's own, Gorila columns
# and evaluations included. 15-50 s, by the machine's load.
@pytest.mark.slow
def test_a_real_gorila_run_draws_every_panel_from_what_it_wrote(tmp_path):
    config = dataclasses.replace(
        dqn.DQNConfig(),
        hidden_sizes=(32, 32),
        batch_size=32,
        min_replay_size=500,
        samples_per_insert=2.0,
        epsilon_decay_steps=2_000,
    )
    cfg = experiment.ExperimentConfig(
        launcher="local",
        learner_mode="gorila",
        num_learners=2,
        num_ps_shards=2,
        num_actors=1,
        num_envs_per_actor=4,
        total_env_steps=3_000,
        num_learner_devices=1,
        eval_interval_s=1.0,
        eval_episodes=2,
        log_interval_s=0.5,
        checkpoint_interval_steps=0,
        logdir=str(tmp_path),
    )
    summary = experiment.run_experiment(dqn.DQNBuilder(config), cfg)
    rows = curves.read_run(str(tmp_path)).rows

    fig = plots.plot_logdirs(
        [str(tmp_path)], str(tmp_path / "all.png"), ("env_steps",), list(plots.PANELS)
    )
    ret, env_rate, update_rate, replay_ratio, gorila = fig.axes
    assert all(ax.get_lines() for ax in fig.axes)
    (greedy,) = _lines(ret, f"{tmp_path} greedy")
    # The greedy curve ends at the run's result, the driver's final evaluation.
    assert greedy.get_xdata()[-1] == summary["env_steps"]
    assert greedy.get_ydata()[-1] == pytest.approx(summary["final_eval_return"])
    applied, _ = gorila.get_lines()
    assert applied.get_ydata()[-1] == rows[-1]["gradients_applied"] > 0
    (ratio,) = replay_ratio.get_lines()
    # Two workers' updates of 32 items each over the env steps so far.
    assert ratio.get_ydata()[-1] == pytest.approx(
        rows[-1]["learner_steps"] * 32 / rows[-1]["env_steps"]
    )
    assert os.path.isfile(plots.write_run_curves(str(tmp_path)))
