"""Checkpoint and resume: train, stop, resume with real Reverb, envpool and launchers."""

import csv
import dataclasses
import functools
import glob
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from agents import dqn
from gorila_jax import builder as builder_lib
from gorila_jax import envs, replay, types
from gorila_jax.distributed import launchers
from gorila_jax.learning import checkpoint
from gorila_jax.learning import config_record
from gorila_jax.run import experiment
from tests import REPO
from tests import fakes
from tests.backends import DefaultReplayNode

SPEC = envs.env_spec("CartPole-v1")
CONFIG = dataclasses.replace(
    dqn.DQNConfig(),
    hidden_sizes=(32, 32),
    batch_size=32,
    min_replay_size=200,
    max_replay_size=5_000,
    samples_per_insert=2.0,
    epsilon_decay_steps=2_000,
)


def _experiment(logdir, **overrides) -> experiment.ExperimentConfig:
    settings = dict(
        launcher="local",
        logdir=str(logdir),
        seed=0,
        num_actors=1,
        num_envs_per_actor=4,
        num_learner_devices=1,
        eval_episodes=2,
        eval_interval_s=1.0,
        log_interval_s=0.5,
        checkpoint_interval_steps=40,
        max_checkpoints_to_keep=2,
    )
    return experiment.ExperimentConfig(**{**settings, **overrides})


def _csv_rows(logdir) -> list[dict[str, float]]:
    with open(os.path.join(logdir, "metrics.csv")) as f:
        return [
            {key: float(row[key]) for key in ("wall_time_s", "env_steps", "learner_steps")}
            for row in csv.DictReader(f)
        ]


def test_train_stop_resume_continues_counters_curve_and_evaluations(tmp_path):
    builder = dqn.DQNBuilder(CONFIG)
    first = experiment.run_experiment(builder, _experiment(tmp_path, total_env_steps=2_000))
    first_rows = _csv_rows(tmp_path)
    # The final checkpoint is taken after the learner stopped: it is its last step.
    assert checkpoint.saved_steps(tmp_path)[-1] == first["params_version"] > 0

    # A run ends past its budget by what its actors did until they were stopped,
    # more on a faster machine: the second budget goes on from where the first ended.
    budget = first["env_steps"] + 2_000
    second = experiment.run_experiment(
        builder, _experiment(tmp_path, total_env_steps=budget, resume=True)
    )
    assert second["resumed_from_learner_step"] == first["params_version"]
    assert second["env_steps"] >= budget > first["env_steps"] >= 2_000
    assert second["learner_steps"] > first["learner_steps"]
    assert second["episodes"] > first["episodes"]
    assert second["wall_time_s"] > first["wall_time_s"]
    # The evaluation history continues rather than restarting.
    assert second["evaluations"][: len(first["evaluations"])] == first["evaluations"]
    assert len(second["evaluations"]) > len(first["evaluations"])
    # The learning curve: the first run's rows, then rows that go on from them.
    rows = _csv_rows(tmp_path)
    assert rows[: len(first_rows)] == first_rows
    assert len(rows) > len(first_rows)
    for column in ("wall_time_s", "env_steps", "learner_steps"):
        values = [row[column] for row in rows]
        assert values == sorted(values), f"{column} goes backwards in metrics.csv"
    # Periodic checkpoints were taken and old ones deleted, learner and replay alike.
    steps = checkpoint.saved_steps(tmp_path)
    assert len(steps) == 2 and steps[-1] == second["params_version"]
    assert sorted(int(d) for d in os.listdir(checkpoint.replay_dir(tmp_path)) if d.isdigit()) == (
        steps
    )


def test_a_run_too_short_for_a_periodic_evaluation_ends_with_one_that_is_checkpointed(tmp_path):
    # No periodic evaluation can be due, however fast or slow the machine:
    # the one in the history is the evaluator's last, at the run's end.
    cfg = _experiment(tmp_path, total_env_steps=1_000, eval_interval_s=3_600.0)
    summary = experiment.run_experiment(dqn.DQNBuilder(CONFIG), cfg)
    [last] = summary["evaluations"]
    assert last["env_steps"] == summary["env_steps"]  # after the actors' final counters
    # The rate limiter made the learner step before the actors could finish.
    assert 0 < last["param_version"] <= summary["params_version"]
    assert last["num_episodes"] == cfg.eval_episodes
    # The final checkpoint holds it, so a resumed run's history starts with it.
    resume = checkpoint.find_resume_point(str(tmp_path), _target())
    assert resume.step == summary["params_version"]
    assert resume.meta["evaluations"] == summary["evaluations"]


def _program(logdir, resume=None):
    """The experiment's graph, driven by hand: the learner's run is disabled."""
    cfg = _experiment(logdir, eval_interval_s=0.0, checkpoint_interval_steps=1_000)
    builder = dqn.DQNBuilder(CONFIG)
    graph = experiment.make_program(builder, cfg, SPEC, resume)
    graph.node("learner").disable_run()
    if resume is not None:
        graph.node("actor").disable_run()  # nothing may change replay after the restore
    return graph


def test_resumed_nodes_hold_the_saved_parameters_replay_and_counters(tmp_path):
    with launchers.launch(_program(tmp_path), "local") as running:
        replay_client, learner, actor = (running.client(n) for n in ("replay", "learner", "actor"))
        table = dqn.builder.TABLE
        assert fakes.wait_until(lambda: replay_client.table_info()[table]["size"] >= 300, 120)
        actor.stop()
        assert actor.wait_finished(60)
        for _ in range(5):
            while not learner.step():
                pass
        saved_step = learner.save_checkpoint()
        saved_version, saved = learner.get_params()
        saved_size = replay_client.table_info()[table]["size"]
        saved_actor = actor.counters()

    target = jax.device_get(dqn.DQNBuilder(CONFIG).init_train_state(jax.random.PRNGKey(0), SPEC))
    resume = checkpoint.find_resume_point(str(tmp_path), target)
    assert resume.step == saved_step == saved_version == 5
    with launchers.launch(_program(tmp_path, resume), "local") as running:
        learner, replay_client = running.client("learner"), running.client("replay")
        version, params = learner.get_params()
        assert version == saved_version
        # Bit for bit: same dtypes, same values.
        jax.tree.map(functools.partial(np.testing.assert_array_equal, strict=True), params, saved)
        assert replay_client.table_info()[table]["size"] == saved_size
        counters = running.client("actor").counters()
        assert counters["env_steps"] == saved_actor["env_steps"] > 0
        assert counters["episodes"] == saved_actor["episodes"]
        assert running.client("monitor").snapshot()["env_steps"] == saved_actor["env_steps"]
        while not learner.step():
            pass
        assert learner.get_params()[0] == saved_version + 1


def _fake_run(logdir, steps: list[int]) -> None:
    """Learner and replay checkpoints at `steps`, each with a state of its own, as a run leaves."""
    builder = dqn.DQNBuilder(CONFIG)
    node = DefaultReplayNode(
        functools.partial(builder_lib.replay_tables, builder, SPEC),
        checkpoint_dir=checkpoint.replay_dir(logdir),
    )
    codec = builder.replay_layout(SPEC).codec
    writer = replay.connect(node).writer(dqn.builder.TABLE)
    obs = SPEC.zeros_observation(10)
    zeros = np.zeros(10, np.float32)
    items = types.Transition(obs, np.zeros(10, np.int32), zeros, zeros, obs)
    saver = checkpoint.LearnerCheckpoints(checkpoint.learner_dir(logdir))
    try:
        for step in steps:
            writer.write(codec.encode(items), np.ones(10))
            writer.flush()
            info = node.checkpoint(step)
            state = jax.device_get(builder.init_train_state(jax.random.PRNGKey(step), SPEC))
            saver.save(step, state, {"learner_steps": step, "replay": info})
    finally:
        writer.close()
        node.close()


def _target():
    return jax.device_get(dqn.DQNBuilder(CONFIG).init_train_state(jax.random.PRNGKey(0), SPEC))


def _truncate(pattern: str) -> None:
    files = [f for f in glob.glob(pattern, recursive=True) if os.path.isfile(f)]
    assert files, pattern
    for file in files:
        with open(file, "r+b") as f:
            f.truncate(os.path.getsize(file) // 2)


@pytest.mark.parametrize(
    "damage",
    [
        "learner/20/state.npz",  # array data
        "learner/20/meta.json",  # counters
        "replay/20/<items>",  # the replay's items (Reverb would load them as an empty table)
    ],
)
def test_a_truncated_checkpoint_is_skipped_with_a_warning(tmp_path, caplog, damage):
    _fake_run(tmp_path, [10, 20])
    path = os.path.join(checkpoint.checkpoint_root(tmp_path), damage)
    if path.endswith("<items>"):  # each backend's own file of them
        directory = os.path.dirname(path)
        native = replay.checkpoint_backend(directory) == replay.NATIVE
        items = f"table-{dqn.builder.TABLE}.npz" if native else "chunks.tfrecord"
        path = os.path.join(directory, items)
    _truncate(path)
    with caplog.at_level(logging.WARNING):
        resume = checkpoint.find_resume_point(str(tmp_path), _target())
    assert resume.step == 10
    assert resume.meta["replay"]["table_sizes"] == {dqn.builder.TABLE: 10}
    assert any("skipping checkpoint" in r.message and "/20" in r.message for r in caplog.records)
    # The unusable newer checkpoint is gone, so the resumed run's saves are the newest.
    assert checkpoint.saved_steps(tmp_path) == [10]
    assert not os.path.exists(os.path.join(checkpoint.replay_dir(tmp_path), "20"))


def test_a_partially_written_checkpoint_is_never_loaded(tmp_path):
    _fake_run(tmp_path, [10, 20])
    # What a save cut short leaves: a temporary name, never renamed.
    learner_dir = checkpoint.learner_dir(tmp_path)
    shutil.copytree(f"{learner_dir}/20", f"{learner_dir}/30.tmp-1795953567")
    assert checkpoint.saved_steps(tmp_path) == [10, 20]
    assert checkpoint.restore_newest(str(tmp_path), _target()).step == 20
    # The next writer (a resumed or restarted learner) deletes the leftover.
    checkpoint.LearnerCheckpoints(learner_dir)
    assert sorted(os.listdir(learner_dir)) == ["10", "20"]


def test_a_learner_checkpoint_keeps_bfloat16_leaves_and_refuses_another_agents_state(tmp_path):
    import ml_dtypes

    state = {"params": np.arange(6, dtype=ml_dtypes.bfloat16).reshape(2, 3), "step": np.int64(4)}
    checkpoints = checkpoint.LearnerCheckpoints(str(tmp_path), max_to_keep=2)
    checkpoints.save(4, state, {"learner_steps": 4})
    restored, meta = checkpoints.restore(4, state)
    jax.tree.map(functools.partial(np.testing.assert_array_equal, strict=True), restored, state)
    assert meta == {"learner_steps": 4}
    wider = {**state, "params": np.zeros((2, 4), ml_dtypes.bfloat16)}
    with pytest.raises(ValueError, match=r"checkpoint 4 holds a bfloat16\[2, 3\] leaf"):
        checkpoints.restore(4, wider)
    with pytest.raises(ValueError, match="checkpoint 4 holds a state of another structure"):
        checkpoints.restore(4, {**state, "target_params": state["params"]})


def test_resume_without_a_checkpoint_fails_before_anything_starts(tmp_path):
    cfg = _experiment(tmp_path, resume=True)
    cfg.validate()  # the settings are fine; the logdir is checked as the run readies it
    with pytest.raises(checkpoint.CheckpointError, match="resume: no checkpoint in"):
        experiment.run_experiment(dqn.DQNBuilder(CONFIG), cfg)
    assert not os.path.exists(os.path.join(tmp_path, "metrics.csv"))  # nothing started
    _fake_run(tmp_path, [10])
    _truncate(os.path.join(checkpoint.learner_dir(tmp_path), "10/state.npz"))
    with pytest.raises(checkpoint.CheckpointError, match="none of the 1 checkpoints"):
        checkpoint.find_resume_point(str(tmp_path), _target())


def test_a_new_run_records_its_configs_and_refuses_to_mix_with_an_earlier_runs_checkpoints(
    tmp_path,
):
    builder, cfg = dqn.DQNBuilder(CONFIG), _experiment(tmp_path)
    resume = checkpoint.prepare_logdir(str(tmp_path), False, builder, cfg, lambda: None)
    assert resume is None
    # config.json rebuilds the same agent config (JSON turned its tuples into lists).
    record = config_record.read_config(str(tmp_path))
    assert config_record.config_from_dict(dqn.DQNConfig, record["agent_config"]) == CONFIG
    assert record["builder"] == "agents.dqn.builder.DQNBuilder"
    # An earlier run's checkpoints are the run layer's to set aside (test_logdir.py),
    # never deleted or mixed in here.
    _fake_run(tmp_path, [10])
    with pytest.raises(checkpoint.CheckpointError, match="holds the checkpoints of an earlier"):
        checkpoint.prepare_logdir(str(tmp_path), False, builder, cfg, lambda: None)
    assert checkpoint.saved_steps(tmp_path) == [10]


def _learner_steps_logged(logdir) -> bool:
    try:
        return any(row["learner_steps"] > 0 for row in _csv_rows(logdir))
    except (OSError, KeyError, ValueError):  # not written yet, or half a row
        return False


def _stacks(pid: int) -> str:
    """Every thread's stack of process `pid` (py-spy, in the default set), for a failure."""
    py_spy = os.path.join(os.path.dirname(sys.executable), "py-spy")
    if not os.path.exists(py_spy):
        return "(no py-spy here)\n"
    dump = subprocess.run([py_spy, "dump", "--pid", str(pid)], capture_output=True, text=True)
    return dump.stdout + dump.stderr


@pytest.mark.parametrize(
    "signals, exit_code",
    [
        ([signal.SIGTERM], 143),  # the shell's code for SIGTERM
        # A key pressed twice: the second is said and ignored, the run still ends whole.
        ([signal.SIGINT, signal.SIGINT], 130),
    ],
    ids=["sigterm", "two_ctrl_c"],
)
def test_a_signal_stops_the_run_cleanly_after_a_final_checkpoint(tmp_path, signals, exit_code):
    flags = [
        "--launcher=local",
        "--num_actors=1",
        "--num_envs_per_actor=4",
        "--num_learner_devices=1",
        "--eval_interval_s=0",
        "--total_env_steps=100000000",
        "--checkpoint_interval_steps=1000000",  # only the final checkpoint
        f"--logdir={tmp_path}",
        "--config.hidden_sizes=(32,32)",
        "--config.batch_size=32",
        "--config.min_replay_size=200",
    ]
    repo = REPO
    # A file, not a pipe nobody reads while the run goes on: a full pipe would
    # block the run's prints, and the output is there to show if it fails.
    log = tmp_path / "train.log"
    with (
        open(log, "w") as out,
        subprocess.Popen(
            [sys.executable, "-m", "launch.train", *flags],
            cwd=repo,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        ) as process,
    ):
        try:
            # A run that ended by itself will never log a step: stop waiting for it.
            fakes.wait_until(
                lambda: _learner_steps_logged(tmp_path) or process.poll() is not None, 240
            )
            assert process.poll() is None and _learner_steps_logged(tmp_path), (
                f"no learner step logged while the run went on (exit code {process.poll()}):\n"
                + log.read_text()[-3000:]
            )
            for number in signals:
                process.send_signal(number)
                time.sleep(0.3)
            try:
                process.wait(timeout=240)
            except subprocess.TimeoutExpired:
                raise AssertionError(
                    "the run did not exit; its threads:\n"
                    + _stacks(process.pid)
                    + log.read_text()[-2000:]
                ) from None
        finally:
            process.kill()
    output = log.read_text()
    assert process.returncode == exit_code, output[-2000:]
    assert "interrupted: final evaluation skipped" in output
    if len(signals) > 1:
        assert "stopping already: the final checkpoint and summary come first" in output
    assert "Traceback" not in output
    with open(tmp_path / "summary.json") as f:
        summary = json.load(f)
    assert summary["stop_reason"] == "interrupted"
    assert checkpoint.saved_steps(tmp_path) == [summary["params_version"]]
    assert summary["params_version"] > 0


@pytest.mark.slow
@pytest.mark.extended  # CI resumes under local, and restarts a learner from a checkpoint under ray
def test_resume_under_the_ray_launcher_with_a_relative_logdir(tmp_path, monkeypatch, ray_options):
    # Nodes are processes of their own with another working directory: a
    # relative logdir must still reach them as the same place.
    monkeypatch.chdir(tmp_path)
    builder = dqn.DQNBuilder(CONFIG)
    settings = dict(
        launcher="ray",
        num_actors=2,
        learner_cpus=0.5,
        replay_cpus=0.5,
        cpus_per_actor=0.5,
        checkpoint_interval_steps=100,
    )
    first = experiment.run_experiment(
        builder, _experiment("run", total_env_steps=3_000, **settings), **ray_options
    )
    budget = first["env_steps"] + 3_000  # from where the first ended, past its budget
    second = experiment.run_experiment(
        builder,
        _experiment("run", total_env_steps=budget, resume=True, **settings),
        **ray_options,
    )
    assert second["resumed_from_learner_step"] == first["params_version"] > 0
    assert second["learner_steps"] > first["learner_steps"]
    assert second["env_steps"] >= budget
    assert checkpoint.saved_steps(tmp_path / "run")[-1] == second["params_version"]
