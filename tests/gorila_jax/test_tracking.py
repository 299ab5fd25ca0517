"""`--wandb_project`: a real run tracked by wandb in its offline mode (no network here),
read back from the record log wandb writes under <logdir>/wandb."""

import csv
import glob
import json
import os
import struct
import subprocess
import sys

import pytest

from agents import dqn
from gorila_jax import tracking
from tests import REPO
from tests.gorila_jax.learning.test_checkpoint import CONFIG, _experiment

wandb = pytest.importorskip("wandb", reason="wandb is the default set's")
from wandb.proto import wandb_internal_pb2  # noqa: E402

TRACKED = dict(wandb_project="gorila-jax-test", wandb_mode="offline", wandb_tags="ci, cartpole")


@pytest.fixture
def wandb_service(monkeypatch):
    # W&B's reports of its own errors to its servers run OpenTelemetry exporter threads
    # for the process's life; nothing here can reach them.
    monkeypatch.setenv("WANDB_ERROR_REPORTING", "false")
    yield
    wandb.teardown()  # its wandb-core process ends with the test, not the worker


def _records(path: str):
    """The protobuf records of a wandb record log (`run-<id>.wandb`): LevelDB's log
    format, 32 KiB blocks of (crc32, length, kind) chunks, after a 7-byte header."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:4] == b":W&B"
    block, position, pending = 32768, 7, b""
    while position + 7 <= len(data):
        if block - position % block < 7:  # the rest of a block is padding
            position += block - position % block
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + 7])
        if kind == 0 and length == 0:
            break
        pending += data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (1, 4):  # a whole record, or its last chunk
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def _key(item) -> str:
    return item.key or "/".join(item.nested_key)


def _logged(run_dir: str) -> dict:
    """What the run logged: its run record, history rows, summary updates and exit code."""
    (path,) = glob.glob(os.path.join(run_dir, "run-*.wandb"))
    seen = {"history": [], "summary": {}, "config": {}}
    for record in _records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            seen["run"] = record.run
            seen["config"].update(
                {item.key: json.loads(item.value_json) for item in record.run.config.update}
            )
        elif kind == "history":
            row = {_key(item): json.loads(item.value_json) for item in record.history.item}
            seen["history"].append(row)
        elif kind == "summary":
            seen["summary"].update(
                {_key(item): json.loads(item.value_json) for item in record.summary.update}
            )
        elif kind == "exit":
            seen["exit_code"] = record.exit.exit_code
    return seen


def test_a_tracked_run_logs_its_rows_config_summary_and_curves_and_a_resume_continues_it(
    tmp_path, wandb_service
):
    from gorila_jax.run import experiment

    cfg = _experiment(tmp_path, total_env_steps=2_000, **TRACKED)
    summary = experiment.run_experiment(dqn.DQNBuilder(CONFIG), cfg)
    # The record log is written by wandb's service process; it has all of it once that
    # process ended (as it does when a launch.train process exits).
    wandb.teardown()
    with open(tmp_path / tracking.RUN_ID_FILE) as f:
        run_id = f.read().strip()
    (run_dir,) = glob.glob(str(tmp_path / "wandb" / f"offline-run-*-{run_id}"))
    seen = _logged(run_dir)
    assert seen["run"].project == "gorila-jax-test" and seen["run"].run_id == run_id
    assert list(seen["run"].tags) == ["ci", "cartpole"]
    assert seen["config"]["experiment"]["total_env_steps"] == 2_000
    assert seen["config"]["agent"]["batch_size"] == CONFIG.batch_size
    # Every metrics.csv row, in order, against env steps.
    with open(tmp_path / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    rows_logged = [row for row in seen["history"] if "learner_steps" in row]
    assert [row["env_steps"] for row in rows_logged] == [int(r["env_steps"]) for r in rows]
    assert rows_logged[-1]["learner_steps"] == int(rows[-1]["learner_steps"])
    # The summary's figures, and curves.png as an image.
    assert seen["summary"]["final_eval_return"] == summary["final_eval_return"]
    assert seen["summary"]["learner_steps"] == summary["learner_steps"]
    assert any(row.get("curves/_type") == "image-file" for row in seen["history"])
    assert seen["exit_code"] == 0

    # --resume continues the same W&B run.
    resumed = _experiment(tmp_path, total_env_steps=3_000, resume=True, **TRACKED)
    experiment.run_experiment(dqn.DQNBuilder(CONFIG), resumed)
    wandb.teardown()
    with open(tmp_path / tracking.RUN_ID_FILE) as f:
        assert f.read().strip() == run_id
    run_dirs = sorted(glob.glob(str(tmp_path / "wandb" / f"offline-run-*-{run_id}")))
    assert len(run_dirs) == 2
    later = _logged(run_dirs[-1])
    assert later["run"].run_id == run_id
    assert later["summary"]["env_steps"] >= 3_000


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"wandb_entity": "team"}, "wandb_entity need wandb_project"),
        ({"wandb_tags": "a", "wandb_mode": "offline"}, "wandb_tags, wandb_mode need wandb_project"),
    ],
)
def test_w_and_b_settings_without_a_project_are_refused(tmp_path, settings, message):
    with pytest.raises(ValueError, match=message):
        _experiment(tmp_path, **settings).validate()


def test_a_w_and_b_run_that_cannot_start_ends_the_command_with_one_line(tmp_path):
    # Online without an API key (and without a network): refused before any node starts.
    env = {key: value for key, value in os.environ.items() if not key.startswith("WANDB_")}
    env.update(HOME=str(tmp_path / "home"), WANDB_ERROR_REPORTING="false")
    logdir = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "launch.train", "--wandb_project=gorila-jax-test"]
        + ["--launcher=local", f"--logdir={logdir}"],
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.startswith("error: W&B could not start the run: UsageError"), result.stderr
    assert "--wandb_mode=offline" in result.stderr
    assert not (logdir / "metrics.csv").exists() and not (logdir / "checkpoints").exists()
