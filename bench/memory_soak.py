"""Resident memory of every node over an undisturbed run under the ray launcher.

Starts `python -m launch.train --launcher=ray` for `--duration_s` and samples
the RSS of each node's process (pids from `<logdir>/nodes.json`) every
`--sample_interval_s`. Reports, per node, RSS at the end of `--warmup_s` and
at the end, and the growth in between; `ok` is false if any node grew more
than `--max_growth` (10 %). Last line: JSON.

  python bench/memory_soak.py --duration_s=600
  python bench/memory_soak.py --duration_s=120 --warmup_s=30   # a short check
"""

import json
import os
import subprocess
import sys
import tempfile
import time

import psutil
from absl import app, flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_DURATION = flags.DEFINE_float("duration_s", 600.0, "Wall-clock length of the run.")
_WARMUP = flags.DEFINE_float("warmup_s", 120.0, "Seconds after the first sample not judged.")
_INTERVAL = flags.DEFINE_float("sample_interval_s", 5.0, "Seconds between samples.")
_MAX_GROWTH = flags.DEFINE_float("max_growth", 0.10, "Largest allowed growth after warm-up.")
_TRAIN_FLAGS = flags.DEFINE_list(
    "train_flags",
    [
        "--agent=dqn",
        "--env=CartPole-v1",
        "--num_actors=2",
        "--cpus_per_actor=0.5",
        "--learner_cpus=0.5",
        "--replay_cpus=0.5",
        "--checkpoint_interval_steps=2000",
    ],
    "Flags for launch.train.",
)


def _rss_mb(pid: int) -> float | None:
    try:
        return psutil.Process(pid).memory_info().rss / 2**20
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def main(argv):
    del argv
    logdir = tempfile.mkdtemp(prefix="memory-soak-")
    command = [
        sys.executable,
        "-m",
        "launch.train",
        "--launcher=ray",
        f"--max_wall_time_s={_DURATION.value}",
        "--total_env_steps=1000000000",
        f"--logdir={logdir}",
        *_TRAIN_FLAGS.value,
    ]
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL)
    series: dict[str, list[tuple[float, float]]] = {}
    first = None
    while process.poll() is None:
        time.sleep(_INTERVAL.value)
        try:
            with open(os.path.join(logdir, "nodes.json")) as f:
                nodes = json.load(f)
        except (OSError, ValueError):
            continue
        now = time.monotonic()
        first = first if first is not None else now
        for name, node in nodes.items():
            rss = _rss_mb(node["pid"]) if node.get("pid") else None
            if rss is not None:
                series.setdefault(name, []).append((now - first, rss))
    report = {}
    for name, samples in sorted(series.items()):
        after = [rss for t, rss in samples if t >= _WARMUP.value]
        if len(after) < 2:
            continue
        growth = (after[-1] - after[0]) / after[0]
        report[name] = {
            "rss_mb_after_warmup": round(after[0], 1),
            "rss_mb_end": round(after[-1], 1),
            "rss_mb_max": round(max(after), 1),
            "growth": round(growth, 4),
        }
    ok = bool(report) and all(r["growth"] <= _MAX_GROWTH.value for r in report.values())
    print(
        json.dumps(
            {
                "duration_s": _DURATION.value,
                "warmup_s": _WARMUP.value,
                "exit_code": process.returncode,
                "logdir": logdir,
                "nodes": report,
                "ok": ok,
            }
        )
    )


if __name__ == "__main__":
    app.run(main)
