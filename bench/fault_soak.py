"""Fault-injection soak: a run under the ray launcher whose nodes are killed with SIGKILL.

Starts `python -m launch.train --launcher=ray` for `--duration_s`, and every
`--kill_interval_s` kills one node chosen at random among `--targets` (pids
from `<logdir>/nodes.json`). For each kill it records how long until the
replacement's counters moved past the victim's (time to recover) and, for
the learner, the updates lost (its reported steps minus the checkpoint step
the replacement started from). With `--baseline` an undisturbed run of the
same length runs first, for the final-return comparison. Last line: JSON.

  python bench/fault_soak.py --duration_s=600 --kill_interval_s=60 --baseline
  python bench/fault_soak.py --duration_s=120 --kill_interval_s=30   # a short check

The replay node may be a target (`--targets=actor,learner,replay`): it sends
no heartbeats, so it counts as recovered when a new replay process runs and
the learner's steps move past their value at the kill (the learner samples
again). It restarts on the same port and restores its newest checkpoint.
"""

import csv
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

from absl import app, flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_DURATION = flags.DEFINE_float("duration_s", 600.0, "Wall-clock length of each run.")
_KILL_INTERVAL = flags.DEFINE_float("kill_interval_s", 60.0, "Seconds between kills.")
_TARGETS = flags.DEFINE_list(
    "targets", ["actor", "learner", "replay"], "Node groups that may be killed."
)
_BASELINE = flags.DEFINE_bool("baseline", False, "Also run an undisturbed run for comparison.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the run and of the victim choice.")
_TRAIN_FLAGS = flags.DEFINE_list(
    "train_flags",
    [
        "--agent=dqn",
        "--env=CartPole-v1",
        "--num_actors=2",
        "--cpus_per_actor=0.5",
        "--learner_cpus=0.5",
        "--replay_cpus=0.5",
        "--checkpoint_interval_steps=500",
        "--heartbeat_timeout=10",
        "--max_restarts=100",
    ],
    "Flags for launch.train.",
)


def _read_status(logdir: str) -> dict:
    try:
        with open(os.path.join(logdir, "nodes.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def _start(logdir: str, duration_s: float) -> subprocess.Popen:
    command = [
        sys.executable,
        "-m",
        "launch.train",
        "--launcher=ray",
        f"--seed={_SEED.value}",
        f"--max_wall_time_s={duration_s}",
        "--total_env_steps=1000000000",
        f"--logdir={logdir}",
        *_TRAIN_FLAGS.value,
    ]
    return subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL)


def _progress(status: dict) -> float:
    counters = status.get("counters", {})
    return counters.get("env_steps", counters.get("learner_steps", 0))


def _watched(status: dict, name: str) -> dict:
    """The node whose progress shows that `name` works again: itself, or for the
    replay (no heartbeats) the learner that samples from it."""
    return status.get("learner/0", {}) if name.startswith("replay") else status.get(name, {})


def _kill_one(logdir: str, rng: random.Random, timeout_s: float) -> dict | None:
    status = _read_status(logdir)
    victims = [
        name
        for name, node in status.items()
        if name.split("/")[0] in _TARGETS.value
        and node.get("pid")
        and _watched(status, name).get("counters")
    ]
    if not victims:
        return None
    name = rng.choice(victims)
    victim = status[name]
    progress_at_kill = _progress(_watched(status, name))
    try:
        os.kill(victim["pid"], signal.SIGKILL)
    except ProcessLookupError:  # nodes.json is older than the node's end (a restart, the stop)
        return None
    killed = time.monotonic()
    record = {"node": name, "progress_at_kill": progress_at_kill, "recovered_s": None}
    while time.monotonic() - killed < timeout_s:
        status_now = _read_status(logdir)
        now = status_now.get(name, {})
        replaced = now.get("pid") not in (None, victim["pid"])
        if replaced and _progress(_watched(status_now, name)) > progress_at_kill:
            record["recovered_s"] = time.monotonic() - killed
            if name.startswith("learner"):
                started_from = now["counters"].get("started_from_step", -1)
                record["learner_steps_lost"] = progress_at_kill - max(started_from, 0)
            break
        time.sleep(0.5)
    return record


def _summary(logdir: str) -> dict:
    """The run's summary.json; a run that ended without one reports its last metrics row."""
    try:
        with open(os.path.join(logdir, "summary.json")) as f:
            return json.load(f)
    except OSError:
        with open(os.path.join(logdir, "metrics.csv")) as f:
            last = list(csv.DictReader(f))[-1]
        return {
            "summary_missing": True,
            "env_steps": int(float(last["env_steps"])),
            "learner_steps": int(float(last["learner_steps"])),
            "final_eval_return": float(last["eval_return"]),
        }


def soak(duration_s: float, kill_interval_s: float) -> dict:
    logdir = tempfile.mkdtemp(prefix="fault-soak-")
    rng = random.Random(_SEED.value)
    process = _start(logdir, duration_s)
    start = time.monotonic()
    kills = []
    next_kill = start + kill_interval_s
    # No kill in the last interval: the run stops before a victim could recover.
    last_kill = start + duration_s - kill_interval_s
    while process.poll() is None:
        if last_kill >= time.monotonic() >= next_kill:
            record = _kill_one(logdir, rng, timeout_s=kill_interval_s)
            if record is not None:
                kills.append(record)
                print(json.dumps(record), flush=True)
            next_kill += kill_interval_s
        time.sleep(0.5)
    summary = _summary(logdir)
    recovered = [k["recovered_s"] for k in kills if k["recovered_s"] is not None]
    return {
        "logdir": logdir,
        "exit_code": process.returncode,
        "kills": kills,
        "restarts": len(summary.get("restarts", [])),
        "unrecovered_kills": sum(k["recovered_s"] is None for k in kills),
        "max_recover_s": max(recovered, default=None),
        "mean_recover_s": sum(recovered) / len(recovered) if recovered else None,
        "learner_steps_lost": sum(k.get("learner_steps_lost", 0) for k in kills),
        "env_steps": summary["env_steps"],
        "learner_steps": summary["learner_steps"],
        "final_eval_return": summary["final_eval_return"],
        "summary_missing": summary.get("summary_missing", False),
    }


def undisturbed(duration_s: float) -> dict:
    logdir = tempfile.mkdtemp(prefix="fault-soak-baseline-")
    process = _start(logdir, duration_s)
    process.wait()
    summary = _summary(logdir)
    return {
        "logdir": logdir,
        "exit_code": process.returncode,
        "env_steps": summary["env_steps"],
        "learner_steps": summary["learner_steps"],
        "final_eval_return": summary["final_eval_return"],
    }


def main(argv):
    del argv
    result = {"duration_s": _DURATION.value, "kill_interval_s": _KILL_INTERVAL.value}
    if _BASELINE.value:
        result["undisturbed"] = undisturbed(_DURATION.value)
    result["disturbed"] = soak(_DURATION.value, _KILL_INTERVAL.value)
    print(json.dumps(result))


if __name__ == "__main__":
    app.run(main)
