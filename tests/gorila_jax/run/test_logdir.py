"""One run per logdir, and an earlier run never lost to a new one (gorila_jax/run/logdir.py):
the lock against another process and after its kill -9, an earlier run set aside and put
back or deleted, and both through the `launch.train` CLI with real runs."""

import json
import os
import signal
import subprocess
import sys

import pytest

from agents import dqn
from gorila_jax.learning import checkpoint
from gorila_jax.run import experiment
from gorila_jax.run import logdir as logdir_lib
from tests import REPO
from tests import fakes
from tests.gorila_jax.learning.test_checkpoint import CONFIG, _experiment, _fake_run


_HOLDER = """
import sys, time
from gorila_jax.run import logdir
with logdir.hold(sys.argv[1]):
    print("held", flush=True)
    time.sleep(600)
"""


def test_a_logdir_held_by_another_process_is_refused_naming_it_until_that_process_dies(
    tmp_path,
):
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(
            logdir_lib.LogdirInUse, match=rf"in use by another run \(pid {holder.pid} "
        ):
            with logdir_lib.hold(str(tmp_path)):
                pass
        # kill -9 leaves no stale lock: the kernel drops it with the process.
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
        with logdir_lib.hold(str(tmp_path)):
            # ... and the holding process may take it again within (the CLI, then the run).
            with logdir_lib.hold(str(tmp_path)):
                pass
    finally:
        holder.kill()
        holder.wait(timeout=30)
        holder.stdout.close()


def _refusal(logdir) -> str:
    with pytest.raises(ValueError) as refused:
        logdir_lib.check_writable(logdir)
    return str(refused.value)


def test_a_logdir_that_cannot_be_written_is_refused_without_a_change(tmp_path):
    before = sorted(os.listdir(tmp_path))
    assert _refusal("") == "logdir must not be empty"
    (tmp_path / "a_file").write_text("not a folder")
    before = sorted(os.listdir(tmp_path))
    assert "a_file is a file, not a folder" in _refusal(str(tmp_path / "a_file" / "run"))
    assert "over the file system's 255" in _refusal(str(tmp_path / ("x" * 300) / "run"))
    # A valid path too long for the run's deepest files (the final save failed on one).
    deep = str(tmp_path / "/".join(["y" * 200] * 20))
    assert "the run's files under it need up to" in _refusal(deep)
    assert sorted(os.listdir(tmp_path)) == before
    logdir_lib.check_writable(str(tmp_path / "new" / "run"))  # a folder to be made: fine
    assert sorted(os.listdir(tmp_path)) == before


def test_a_logdir_in_a_folder_the_user_cannot_write_is_refused(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    # Root writes anywhere: the check runs as nobody then, in a process of its own (a
    # forked copy of a test worker would share its threads' state and its pipes).
    check = (
        "import os, sys\n"
        "from gorila_jax.run import logdir\n"
        "if os.geteuid() == 0:\n"
        "    os.setgid(65534)\n"
        "    os.setuid(65534)\n"
        "try:\n"
        "    logdir.check_writable(sys.argv[1])\n"
        "except ValueError as error:\n"
        "    print(error)\n"
        "else:\n"
        "    print('accepted')\n"
    )
    try:
        said = subprocess.run(
            [sys.executable, "-c", check, str(locked / "run")],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout
    finally:
        locked.chmod(0o755)
    assert "cannot write in" in said and "read-only or no permission" in said, said


def _earlier_run(logdir) -> None:
    _fake_run(logdir, [10, 20])
    with open(os.path.join(logdir, "summary.json"), "w") as f:
        json.dump({"final_eval_return": 123.0}, f)
    with open(os.path.join(logdir, "third_party.log"), "w") as f:
        f.write("the earlier run's library lines\n")


def _summary(logdir) -> dict:
    with open(os.path.join(logdir, "summary.json")) as f:
        return json.load(f)


def test_an_earlier_run_is_set_aside_whole_then_deleted_or_put_back(tmp_path):
    _earlier_run(tmp_path)
    previous = logdir_lib.set_aside(str(tmp_path))
    # Whole and resumable where it went; the logdir is clear for the new run but for the
    # third-party log, which the CLI has open already.
    assert checkpoint.saved_steps(previous.aside) == [10, 20]
    assert _summary(previous.aside) == {"final_eval_return": 123.0}
    assert not logdir_lib.holds_a_run(str(tmp_path))
    assert os.path.exists(tmp_path / "third_party.log")
    # A new run that saved nothing: the earlier one comes back, the new one's files aside.
    with open(tmp_path / "config.json", "w") as f:
        f.write("{}")
    assert not previous.superseded(new_run_saved=False)
    previous.settle(new_run_saved=False)
    assert checkpoint.saved_steps(tmp_path) == [10, 20]
    assert _summary(tmp_path) == {"final_eval_return": 123.0}
    (failed,) = [name for name in os.listdir(tmp_path) if name.startswith("failed-")]
    assert os.listdir(tmp_path / failed) == ["config.json"]
    assert not [name for name in os.listdir(tmp_path) if name.startswith("previous-")]
    # A new run that saved: the earlier one is deleted.
    previous = logdir_lib.set_aside(str(tmp_path))
    assert previous.superseded(new_run_saved=True)
    assert not os.path.exists(previous.aside)
    previous.settle(new_run_saved=True)  # nothing left to do
    assert checkpoint.saved_steps(tmp_path) == []
    # A logdir with no run (a failed run's leftovers and the third-party log) or none at
    # all: nothing to set aside.
    assert logdir_lib.set_aside(str(tmp_path)) is None
    assert logdir_lib.set_aside(str(tmp_path / "new")) is None


@pytest.mark.timeout(300)
def test_a_new_run_that_fails_to_start_leaves_the_earlier_run_in_its_logdir(tmp_path):
    _earlier_run(tmp_path)
    # Nothing listens on port 1: the Ray launcher cannot join that cluster.
    cfg = _experiment(tmp_path, launcher="ray", ray_address="127.0.0.1:1")
    with pytest.raises(Exception):  # noqa: B017  Ray's own error, whichever it is
        experiment.run_experiment(dqn.DQNBuilder(CONFIG), cfg)
    assert checkpoint.saved_steps(tmp_path) == [10, 20]
    assert _summary(tmp_path) == {"final_eval_return": 123.0}


def _train(logdir, *flags: str, **popen) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "launch.train",
            "--launcher=local",
            "--num_actors=1",
            "--num_envs_per_actor=4",
            "--num_learner_devices=1",
            "--eval_episodes=2",
            "--config.hidden_sizes=(32,32)",
            "--config.batch_size=32",
            "--config.min_replay_size=200",
            f"--logdir={logdir}",
            *flags,
        ],
        cwd=REPO,
        text=True,
        **popen,
    )


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_second_run_is_refused_a_logdir_in_use_and_a_later_one_replaces_the_run(tmp_path):
    log = open(tmp_path / "first.log", "w")
    logdir = tmp_path / "run"
    first = _train(
        logdir,
        "--total_env_steps=100000000",
        "--checkpoint_interval_steps=50",
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        assert fakes.wait_until(lambda: checkpoint.saved_steps(logdir), timeout_s=240), open(
            tmp_path / "first.log"
        ).read()[-3000:]
        second = _train(
            logdir, "--total_env_steps=5000", stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        out, err = second.communicate(timeout=240)
        assert second.returncode != 0
        (error,) = [line for line in err.splitlines() if line.startswith("error:")]
        assert f"is in use by another run (pid {first.pid} on " in error, err[-3000:]
        assert "--checkpoint_interval_steps=50" in error  # the holder's command
        # The first run never noticed: it goes on checkpointing, and stops cleanly.
        saved = checkpoint.saved_steps(logdir)
        assert fakes.wait_until(lambda: checkpoint.saved_steps(logdir)[-1] > saved[-1], 120)
        first.send_signal(signal.SIGINT)
        assert first.wait(timeout=240) == 130
    finally:
        first.kill()
        first.wait(timeout=60)
        log.close()
    assert _summary(logdir)["stop_reason"] == "interrupted"
    # A later run there, not --resume: it sets the first aside, and deletes it once it saved.
    third = _train(
        logdir, "--total_env_steps=3000", stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    out, _ = third.communicate(timeout=300)
    assert third.returncode == 0, out[-3000:]
    assert "the run there before is set aside in" in out
    assert _summary(logdir)["stop_reason"] == "total_env_steps reached"
    assert not [name for name in os.listdir(logdir) if name.startswith(("previous-", "failed-"))]
