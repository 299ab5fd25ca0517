"""`python -m launch.sweep`: real launch.train runs, their statistics, skip on re-run, bad grids."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from matplotlib import image
from rliable import library, metrics

from launch import stats, sweep

from tests import REPO

# A CartPole run that is over in seconds once started: the statistics, not the learning, are
# under test here.
TINY_RUN = [
    "--agent=dqn",
    "--env=CartPole-v1",
    "--total_env_steps=1500",
    "--eval_episodes=2",
    "--eval_interval_s=1",
    "--log_interval_s=1",
    "--num_actors=1",
    "--num_envs_per_actor=4",
    "--num_learner_devices=1",
    "--checkpoint_interval_steps=0",
]
# With its final checkpoint: a run whose summary.json was lost resumes from it.
CHECKPOINTED_RUN = [
    *(flag for flag in TINY_RUN if not flag.startswith("--checkpoint_interval_steps")),
    "--checkpoint_interval_steps=100",
]
GRID = ["--grid=config.learning_rate=1e-3,5e-4"]
REPS = 500


def _sweep(sweep_dir, *flags, train_flags=TINY_RUN, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "launch.sweep", f"--sweep_dir={sweep_dir}", *flags]
        + ["--", *train_flags],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1200,
        env=env,
    )


@pytest.fixture(scope="module")
def finished_sweep(tmp_path_factory):
    """A 2-seed x 2-value sweep, run once and then run again with the same command."""
    sweep_dir = str(tmp_path_factory.mktemp("sweep"))
    flags = ["--seeds=2", *GRID, "--threshold=15", f"--bootstrap_reps={REPS}"]
    first = _sweep(sweep_dir, *flags, train_flags=CHECKPOINTED_RUN)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    summaries = {
        path: os.stat(path).st_mtime_ns
        for path in (
            os.path.join(root, "summary.json")
            for root, _, files in os.walk(sweep_dir)
            if "summary.json" in files
        )
    }
    second = _sweep(sweep_dir, *flags, train_flags=CHECKPOINTED_RUN)
    return sweep_dir, flags, first, second, summaries


@pytest.mark.filterwarnings("ignore:random_state is deprecated:FutureWarning")
def test_sweep_statistics_equal_rliable_on_the_runs_final_returns(finished_sweep):
    sweep_dir, _, first, _, _ = finished_sweep
    with open(os.path.join(sweep_dir, "sweep.json")) as f:
        record = json.load(f)
    assert sorted(record["groups"]) == ["learning_rate=1e-3", "learning_rate=5e-4"]
    assert len(record["runs"]) == 4
    for name, group in record["groups"].items():
        runs = [run for run in record["runs"] if run["group"] == name]
        assert sorted(run["seed"] for run in runs) == [0, 1]
        finals = []
        for run in runs:
            with open(os.path.join(run["logdir"], "summary.json")) as f:
                summary = json.load(f)
            # Each run trained with its own grid value and seed.
            assert summary["experiment"]["seed"] == run["seed"]
            assert summary["agent_config"]["learning_rate"] == float(name.split("=")[1])
            assert run["final_return"] == summary["final_eval_return"]
            finals.append(summary["final_eval_return"])
        # rliable 1.2.0 resamples runs with numpy's global generator (see launch/stats.py).
        np.random.seed(stats.DEFAULT_BOOTSTRAP_SEED)
        point, interval = library.get_interval_estimates(
            {name: np.array(finals).reshape(-1, 1)},
            lambda x: np.array([metrics.aggregate_iqm(x)]),
            reps=REPS,
            random_state=np.random.RandomState(stats.DEFAULT_BOOTSTRAP_SEED),
        )
        iqm = group["final_return"]["iqm"]
        assert iqm["estimate"] == pytest.approx(point[name][0])
        assert [iqm["ci_low"], iqm["ci_high"]] == pytest.approx(list(interval[name][:, 0]))
        assert group["final_return"]["mean"]["estimate"] == pytest.approx(np.mean(finals))
        assert group["fraction_at_threshold"] == pytest.approx(np.mean(np.array(finals) >= 15))
        # The printed table carries the same numbers.
        assert (
            f"{iqm['estimate']:,.1f} [{iqm['ci_low']:,.1f}, {iqm['ci_high']:,.1f}]" in first.stdout
        )
    with open(os.path.join(sweep_dir, "sweep.csv")) as f:
        assert len(f.read().strip().splitlines()) == 1 + 4
    # The sweep's picture, and each run's own (written as its training ended).
    assert image.imread(os.path.join(sweep_dir, "sweep.png")).ndim == 3
    for run in record["runs"]:
        assert image.imread(os.path.join(run["logdir"], "curves.png")).ndim == 3


def test_rerunning_the_same_command_skips_every_finished_run(finished_sweep):
    sweep_dir, _, _, second, summaries = finished_sweep
    assert second.returncode == 0, second.stderr[-3000:]
    assert len(summaries) == 4
    for path, mtime in summaries.items():
        assert os.stat(path).st_mtime_ns == mtime, f"{path} was written again"
    assert second.stdout.count("skipped: finished before") == 4
    assert "starting in" not in second.stdout
    with open(os.path.join(sweep_dir, "sweep.json")) as f:
        record = json.load(f)
    assert {run["status"] for run in record["runs"]} == {"skipped"}


def test_a_run_whose_summary_was_lost_is_resumed_and_the_others_statistics_stay(finished_sweep):
    sweep_dir, flags, _, _, _ = finished_sweep
    with open(os.path.join(sweep_dir, "sweep.json")) as f:
        before = json.load(f)
    lost = before["runs"][0]
    os.remove(os.path.join(lost["logdir"], "summary.json"))
    again = _sweep(sweep_dir, *flags, train_flags=CHECKPOINTED_RUN)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert again.stdout.count("skipped: finished before") == 3
    with open(os.path.join(sweep_dir, "sweep.json")) as f:
        after = json.load(f)
    # It was resumed from its final checkpoint (a few updates may come before its stop,
    # so its own final return may move); the runs not re-run and the statistics of the
    # group without it are as they were.
    assert after["runs"][0]["status"] == "finished"
    assert after["runs"][0]["env_steps"] >= lost["env_steps"]
    for earlier, later in zip(before["runs"][1:], after["runs"][1:]):
        for key in ("final_return", "threshold", "env_steps", "wall_time_s"):
            assert later[key] == earlier[key], (later["logdir"], key)
    untouched = [name for name in before["groups"] if name != lost["group"]]
    assert untouched and all(after["groups"][g] == before["groups"][g] for g in untouched)


@pytest.mark.parametrize(
    "flags, train_flags, message",
    [
        (["--grid=config.learnin_rate=1e-3"], TINY_RUN, "no field 'learnin_rate'; did you mean"),
        (["--grid=num_actorz=1,2"], TINY_RUN, "Unknown command line flag 'num_actorz'"),
        (["--grid=num_actors=1,two"], TINY_RUN, "--num_actors=two"),
        (["--grid=num_actors"], TINY_RUN, "expected KEY=VALUE"),
        (["--grid=seed=1,2"], TINY_RUN, "the sweep sets --seed itself"),
        ([], [*TINY_RUN, "--logdir=/tmp/x"], "the sweep sets --logdir"),
        (["--seeds=0"], TINY_RUN, "--seeds must be at least 1"),
        (["--ray_address=127.0.0.1:1"], TINY_RUN, "--ray_address is for --launcher=ray"),
        (["--launcher=anakin"], TINY_RUN, "needs an env written in JAX"),
    ],
)
def test_a_bad_sweep_is_refused_before_any_run_starts(tmp_path, flags, train_flags, message):
    sweep_dir = tmp_path / "sweep"
    result = _sweep(sweep_dir, *flags, train_flags=train_flags)
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0], result.stderr[-2000:]
    assert not sweep_dir.exists()  # nothing was launched or written


def test_grid_points_are_the_product_of_the_values_with_readable_names():
    grid = sweep.parse_grid(["config.learning_rate=1e-3,5e-4", "num_actors=2,4"])
    names = [name for name, _ in sweep.groups(grid)]
    assert names == [
        "learning_rate=1e-3,num_actors=2",
        "learning_rate=1e-3,num_actors=4",
        "learning_rate=5e-4,num_actors=2",
        "learning_rate=5e-4,num_actors=4",
    ]
    assert sweep.groups(grid)[1][1] == ["--config.learning_rate=1e-3", "--num_actors=4"]
    assert sweep.groups([]) == [("base", [])]


@pytest.mark.slow
def test_a_failed_run_is_reported_and_the_sweep_goes_on_then_exits_non_zero(tmp_path):
    # More learner devices than the learner's host has passes every check (a Ray cluster's
    # learner host may have them) and fails at launch, when the learner is built.
    huge, fits = "num_learner_devices=16", "num_learner_devices=1"
    result = _sweep(tmp_path, "--seeds=1", f"--grid={huge},1", train_flags=TINY_RUN)
    assert result.returncode == 1, result.stderr[-3000:]
    assert f"[{huge} seed=0] failed with exit code 1" in result.stdout
    assert "this host has" in result.stdout  # the last lines of the run's console.log
    assert f"[{fits} seed=0] finished" in result.stdout
    with open(tmp_path / "sweep.json") as f:
        record = json.load(f)
    assert {run["group"]: run["status"] for run in record["runs"]} == {
        huge: "failed",
        fits: "finished",
    }
    assert record["groups"][huge]["final_return"] is None
    assert record["groups"][fits]["num_finished"] == 1


def test_an_anakin_sweep_runs_each_seed_on_the_device_loop(tmp_path, one_cpu_device_env):
    train_flags = [
        "--agent=ppo",
        "--env=gymnax/CartPole-v1",
        "--total_env_steps=8192",
        "--num_learner_devices=1",
        "--xla_cpu_threads=1",
    ]
    # One CPU device: the 4 that tests/conftest.py makes would refuse one worker.
    result = _sweep(
        tmp_path, "--seeds=2", "--launcher=anakin", train_flags=train_flags, env=one_cpu_device_env
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    with open(tmp_path / "sweep.json") as f:
        record = json.load(f)
    assert record["launcher"] == "anakin"
    runs = record["runs"]
    assert [run["status"] for run in runs] == ["finished", "finished"]
    for run in runs:
        with open(os.path.join(run["logdir"], "summary.json")) as f:
            summary = json.load(f)
        assert summary["experiment"]["launcher"] == "anakin"
        # Each run's process started JAX with the one XLA:CPU worker it was asked for.
        assert summary["xla_cpu_worker_threads"] == 1
        assert run["final_return"] == summary["final_eval_return"]
    first, second = sorted(runs, key=lambda run: run["process_start_unix"])
    assert second["process_start_unix"] >= first["process_start_unix"] + first["process_wall_s"]


@pytest.mark.slow
def test_under_ray_runs_share_one_cluster_at_the_same_time(tmp_path):
    shares = ["--cpus_per_actor=0.5", "--learner_cpus=0.5", "--replay_cpus=0.5"]
    result = _sweep(
        tmp_path,
        "--seeds=1",
        *GRID,
        "--launcher=ray",
        "--ray_num_cpus=8",
        train_flags=[*TINY_RUN, *shares],
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    with open(tmp_path / "sweep.json") as f:
        record = json.load(f)
    assert record["concurrency"] >= 2
    runs = record["runs"]
    assert {run["status"] for run in runs} == {"finished"}
    addresses = set()
    for run in runs:
        with open(os.path.join(run["logdir"], "summary.json")) as f:
            experiment = json.load(f)["experiment"]
        assert experiment["launcher"] == "ray"
        addresses.add(experiment["ray_address"])
    assert len(addresses) == 1 and None not in addresses  # both joined the sweep's cluster
    first, second = sorted(runs, key=lambda run: run["process_start_unix"])
    assert second["process_start_unix"] < first["process_start_unix"] + first["process_wall_s"]


@pytest.mark.slow
def test_a_sweep_stopped_by_ctrl_c_resumes_its_run_from_the_checkpoint(tmp_path):
    train_flags = [
        *[flag for flag in TINY_RUN if not flag.startswith(("--total_env_steps", "--checkpoint"))],
        "--total_env_steps=12000",
        "--checkpoint_interval_steps=50",
    ]
    command = [sys.executable, "-m", "launch.sweep", f"--sweep_dir={tmp_path}", "--seeds=1"]
    command += ["--", *train_flags]
    logdir = tmp_path / "base" / "seed=0"
    # Ctrl-C on a terminal signals the whole process group: the sweep and its run.
    first = subprocess.Popen(command, cwd=REPO, start_new_session=True, stdout=subprocess.PIPE)
    deadline = time.monotonic() + 600
    while not (logdir / "checkpoints" / "learner").is_dir() or not any(
        name.isdigit() for name in os.listdir(logdir / "checkpoints" / "learner")
    ):
        assert first.poll() is None and time.monotonic() < deadline, "no checkpoint came"
        time.sleep(0.5)
    os.killpg(first.pid, signal.SIGINT)
    first_out = first.communicate(timeout=600)[0].decode()
    assert first.returncode == 130, first_out[-3000:]
    assert "[base seed=0] interrupted" in first_out
    with open(logdir / "summary.json") as f:
        assert json.load(f)["stop_reason"] == "interrupted"

    second = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "[base seed=0] finished" in second.stdout
    with open(logdir / "summary.json") as f:
        summary = json.load(f)
    assert summary["resumed_from_learner_step"] is not None
    assert summary["env_steps"] >= 12000
    with open(tmp_path / "sweep.json") as f:
        assert json.load(f)["runs"][0]["final_return"] == summary["final_eval_return"]
