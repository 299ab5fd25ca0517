"""DQN on CartPole-v1, ours against CleanRL's `dqn_jax.py`: wall time to a return of 475.

For each seed, one after the other on this machine:
  (a) CleanRL's `cleanrl/dqn_jax.py` with its default arguments but `--seed`, in its own
      venv: seconds from the command's start until the mean `episodic_return` of its last
      20 training episodes first reaches 475;
  (b) ours, the default DQN CartPole-v1 command under `local` plus only flags that do not
      change learning (`--logdir`, `--log_interval_s=1`, and `--replay` if `--ours_replay`
      gives it: the replay backend, the same sampling rule either way): seconds from the
      command's start until (i) the first 10-episode greedy evaluation >= 475 and (ii) the
      first 100-episode training mean >= 475.
Each run stops once its criteria are met (ours by SIGINT: it checkpoints and exits) or at
`--max_seconds`. Nothing is asserted: it prints the figures and the ratios ours / CleanRL
(the issue's goal: <= 0.5 for both); the last line is JSON (medians too).

CleanRL is not part of this repository; get the commit these figures refer to with

  git clone https://github.com/vwxyzjn/cleanrl /tmp/cleanrl
  git -C /tmp/cleanrl checkout fe8d8a03c41a7ef5b523e2e354bd01c363e786bb

and run (on an idle machine; the first run makes /tmp/cleanrl-venv from
bench/cleanrl-requirements.txt, a few minutes):

  python bench/vs_cleanrl.py --cleanrl_dir=/tmp/cleanrl --seeds=1,2

Every output line of both is timestamped on arrival (`python -u`); docs/benchmarks.md says
how each criterion is timed and why.
"""

import json
import os
import queue
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Callable

from absl import app, flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench import cleanrl_peer  # noqa: E402
from bench.cleanrl_peer import DEFAULT_VENV  # noqa: E402

CLEANRL_SCRIPT = os.path.join("cleanrl", "dqn_jax.py")
TARGET = 475.0
CLEANRL_WINDOW = 20  # episodes in CleanRL's training mean (the criterion)
OURS_WINDOW = 100  # episodes in our monitor's training mean (gorila_jax/health/monitor.py)
STOP_GRACE_S = 180.0  # ours checkpoints on SIGINT before it exits: slow on a loaded machine

_CLEANRL_DIR = flags.DEFINE_string("cleanrl_dir", None, "A CleanRL checkout (see above).")
_CLEANRL_PYTHON = flags.DEFINE_string(
    "cleanrl_python", None, f"CleanRL's interpreter; unset: {DEFAULT_VENV}, made if missing."
)
_SEEDS = flags.DEFINE_list("seeds", ["1", "2"], "Seeds; each runs CleanRL, then ours.")
_MAX_SECONDS = flags.DEFINE_float("max_seconds", 600.0, "Longest a single run may go on.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Logs and logdirs; unset: a new temp dir.")
_REPLAY = flags.DEFINE_enum(
    "ours_replay", None, ["native", "reverb"], "Ours' --replay backend; unset: the default."
)

# [  12.3s] env steps     4,031 | episodes    137 | return    29.45 | eval      nan | ...
_PROGRESS = re.compile(
    r"^\[\s*([\d.]+)s\] env steps\s+([\d,]+) \| episodes\s+([\d,]+) \| "
    r"return\s+(\S+) \| eval\s+(\S+) \|"
)


parse_cleanrl_episode = cleanrl_peer.parse_episode


def parse_progress_line(line: str) -> dict[str, float] | None:
    """The numbers of one of our plain progress lines (`metrics.progress_line`), else None."""
    match = _PROGRESS.match(line)
    if not match:
        return None
    wall, steps, episodes, mean_return, eval_return = match.groups()
    return {
        "wall_time_s": float(wall),
        "env_steps": int(steps.replace(",", "")),
        "episodes": int(episodes.replace(",", "")),
        "mean_return": float(mean_return),  # "nan" parses as NaN, which is never >= target
        "eval_return": float(eval_return),
    }


class CleanRLWatch:
    """Finds the first moment CleanRL's last-20-episode training mean reaches the target."""

    def __init__(self, target: float = TARGET, window: int = CLEANRL_WINDOW):
        self.target, self.window = target, window
        self.returns: list[float] = []
        self.reached: dict[str, Any] | None = None

    def feed(self, seconds: float, line: str) -> bool:
        """Takes one line that arrived `seconds` after the start; True once reached."""
        episode = parse_cleanrl_episode(line)
        if episode and self.reached is None:
            self.returns.append(episode[1])
            recent = self.returns[-self.window :]
            mean = sum(recent) / len(recent)
            if len(recent) == self.window and mean >= self.target:
                episodes = len(self.returns)
                self.reached = {"seconds": seconds, "env_steps": episode[0], "train_mean": mean}
                self.reached["episodes"] = episodes
        return self.reached is not None


class OursWatch:
    """Finds our first greedy evaluation and first 100-episode training mean at the target."""

    def __init__(self, target: float = TARGET, window: int = OURS_WINDOW):
        self.target, self.window = target, window
        self.eval_seen: dict[str, Any] | None = None  # a fallback if summary.json is missing
        self.train: dict[str, Any] | None = None
        self.startup_s: float | None = None

    def feed(self, seconds: float, line: str) -> bool:
        row = parse_progress_line(line)
        if row is None:
            return self.done
        # The run's clock starts after imports and set-up; a row's line is printed right after
        # its snapshot, so the least difference is that start's offset (to 0.05 s: printed %.1f).
        delay = seconds - row["wall_time_s"]
        self.startup_s = delay if self.startup_s is None else min(self.startup_s, delay)
        if self.eval_seen is None and row["eval_return"] >= self.target:
            self.eval_seen = {"seconds": seconds, "env_steps": row["env_steps"]}
            self.eval_seen["eval_return"] = row["eval_return"]
        full = row["episodes"] >= self.window  # fewer: the mean is not yet over 100
        if self.train is None and full and row["mean_return"] >= self.target:
            self.train = {
                "seconds": seconds,
                "env_steps": row["env_steps"],
                "train_mean": row["mean_return"],
                "wall_time_s": row["wall_time_s"],
            }
        return self.done

    @property
    def done(self) -> bool:
        return self.eval_seen is not None and self.train is not None


def first_evaluation(summary: dict[str, Any], start_unix: float, target: float = TARGET):
    """The first evaluation in summary.json at the target, timed from `start_unix`, or None."""
    for evaluation in summary.get("evaluations", []):
        if evaluation["eval_return"] >= target:
            return {
                "seconds": evaluation["unix_time"] - start_unix,
                "env_steps": evaluation["env_steps"],
                "eval_return": evaluation["eval_return"],
                "episodes": evaluation["num_episodes"],
            }
    return None


def first_csv_row(path: str, target: float = TARGET, window: int = OURS_WINDOW):
    """metrics.csv's first row with a full training window at the target, or None."""
    import csv  # only here: the rest of this file reads console lines

    if not os.path.exists(path):
        return None
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if float(row["episodes"]) >= window and float(row["mean_return"]) >= target:
                return {k: float(row[k]) for k in ("wall_time_s", "env_steps", "mean_return")}
    return None


def _read_lines(pipe: Any, lines: queue.Queue) -> None:
    for line in pipe:
        lines.put(line)


def stream(
    command: list[str],
    cwd: str,
    env: dict[str, str],
    feed: Callable[[float, str], bool],
    stop_signal: int,
    log_path: str,
    max_seconds: float,
) -> dict[str, Any]:
    """Runs `command`, feeding each line with its arrival time; stops it once `feed` says so.

    Stops it with `stop_signal` once `feed` returns True or after `max_seconds`, and kills
    it if it has not exited STOP_GRACE_S later. Every line goes to `log_path` too, with its
    arrival time. Returns the start (unix time), why it stopped and the exit code.
    """
    start = time.time()
    process = subprocess.Popen(
        command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, bufsize=1, start_new_session=True,  # our Ctrl-C is handled below
    )  # fmt: skip
    lines: queue.Queue = queue.Queue()
    reader = threading.Thread(target=_read_lines, args=(process.stdout, lines), daemon=True)
    reader.start()
    reason, stopped_at = "exited", None
    try:
        with open(log_path, "w") as log:
            while reader.is_alive() or not lines.empty():
                try:
                    line = lines.get(timeout=0.1)
                except queue.Empty:
                    line = None
                now = time.time() - start
                if line is not None:
                    log.write(f"[{now:8.2f}] {line}")
                if stopped_at is None:
                    if line is not None and feed(now, line):
                        reason = "reached"
                    elif now >= max_seconds:
                        reason = "max_seconds"
                    if reason != "exited":
                        stopped_at = now
                        if process.poll() is None:
                            process.send_signal(stop_signal)
                elif now - stopped_at > STOP_GRACE_S and process.poll() is None:
                    os.killpg(process.pid, signal.SIGKILL)
    except BaseException:  # the benchmark itself interrupted: leave no run behind
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        raise
    return {"start_unix": start, "stop": reason, "exit_code": process.wait()}


def cleanrl_python(cleanrl_dir: str) -> str:
    """CleanRL's interpreter: the flag's, or the default venv's, made if missing and checked."""
    probe = (
        "import flax, gymnasium, jax, optax, tyro, torch.utils.tensorboard, cleanrl_utils.buffers"
    )
    try:
        return cleanrl_peer.python(cleanrl_dir, _CLEANRL_PYTHON.value, probe)
    except cleanrl_peer.PeerError as error:
        raise app.UsageError(str(error)) from None


def run_cleanrl(seed: int, cleanrl_dir: str, python: str, workdir: str) -> dict[str, Any]:
    load = cleanrl_peer.print_load(f"CleanRL seed {seed}")
    cwd = os.path.join(workdir, f"cleanrl-{seed}")  # dqn_jax.py writes runs/ into its cwd
    os.makedirs(cwd, exist_ok=True)
    command = [python, "-u", os.path.join(cleanrl_dir, CLEANRL_SCRIPT), f"--seed={seed}"]
    watch = CleanRLWatch()
    env = dict(os.environ, PYTHONPATH=cleanrl_dir)  # cleanrl_utils, without installing CleanRL
    log = os.path.join(workdir, f"cleanrl-{seed}.log")
    run = stream(command, cwd, env, watch.feed, signal.SIGTERM, log, _MAX_SECONDS.value)
    return {"load_before": load, "command": command, "log": log, **run, "train": watch.reached}


def run_ours(seed: int, workdir: str) -> dict[str, Any]:
    load = cleanrl_peer.print_load(f"ours seed {seed}")
    logdir = os.path.join(workdir, f"ours-{seed}")
    command = [
        sys.executable, "-u", "-m", "launch.train", "--agent=dqn", "--env=CartPole-v1",
        "--launcher=local", f"--seed={seed}", f"--logdir={logdir}", "--log_interval_s=1",
    ]  # fmt: skip
    if _REPLAY.value:
        command.append(f"--replay={_REPLAY.value}")
    watch = OursWatch()
    log = os.path.join(workdir, f"ours-{seed}.log")
    run = stream(
        command, REPO, dict(os.environ), watch.feed, signal.SIGINT, log, _MAX_SECONDS.value
    )
    summary_path = os.path.join(logdir, "summary.json")
    evaluation, summary = None, {}
    if os.path.exists(summary_path):
        with open(summary_path) as f:
            summary = json.load(f)
        evaluation = first_evaluation(summary, run["start_unix"])
    elif watch.eval_seen:  # no summary (killed): the line that first showed it, <= 1 row late
        evaluation = {**watch.eval_seen, "source": "console"}
    csv_row = first_csv_row(os.path.join(logdir, "metrics.csv")) or {}
    agrees = watch.train and csv_row.get("env_steps") == watch.train["env_steps"]  # None: none
    return {
        "load_before": load,
        "command": command,
        "log": log,
        **run,
        "eval": evaluation,
        "train": watch.train,
        "startup_s": watch.startup_s,
        "csv_agrees": agrees,
        "stop_reason": summary.get("stop_reason"),
        "eval_interval_s": summary.get("experiment", {}).get("eval_interval_s"),
    }


def _ratio(ours: dict | None, theirs: dict | None) -> float | None:
    return ours["seconds"] / theirs["seconds"] if ours and theirs else None


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _seconds(result: dict | None) -> str:
    if not result:
        return "not reached"
    return f"{result['seconds']:.1f} s at {result['env_steps']:,} env steps"


def report_seed(seed: int, cleanrl: dict, ours: dict) -> dict[str, Any]:
    ratios = {
        "eval": _ratio(ours["eval"], cleanrl["train"]),
        "train": _ratio(ours["train"], cleanrl["train"]),
    }
    shown = {k: "-" if v is None else f"{v:.2f}" for k, v in ratios.items()}
    print(
        f"seed {seed}: CleanRL 20-episode training mean >= {TARGET:g}: "
        f"{_seconds(cleanrl['train'])}\n"
        f"seed {seed}: ours greedy evaluation >= {TARGET:g}: {_seconds(ours['eval'])} "
        f"(ratio {shown['eval']})\n"
        f"seed {seed}: ours 100-episode training mean >= {TARGET:g}: "
        f"{_seconds(ours['train'])} (ratio {shown['train']})",
        flush=True,
    )
    return {"seed": seed, "cleanrl": cleanrl, "ours": ours, "ratio": ratios}


def medians(runs: list[dict[str, Any]]) -> dict[str, float | None]:
    def seconds(side: str, key: str) -> list[float | None]:
        return [(run[side][key] or {}).get("seconds") for run in runs]

    return {
        "cleanrl_train_s": _median(seconds("cleanrl", "train")),
        "ours_eval_s": _median(seconds("ours", "eval")),
        "ours_train_s": _median(seconds("ours", "train")),
        "ratio_eval": _median([run["ratio"]["eval"] for run in runs]),
        "ratio_train": _median([run["ratio"]["train"] for run in runs]),
    }


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}")
    try:
        cleanrl_dir, commit = cleanrl_peer.checkout(_CLEANRL_DIR.value, CLEANRL_SCRIPT)
    except cleanrl_peer.PeerError as error:
        raise app.UsageError(str(error)) from None
    try:
        seeds = [int(seed) for seed in _SEEDS.value]
    except ValueError:
        raise app.UsageError(f"--seeds must be integers, got {_SEEDS.value}") from None
    python = cleanrl_python(cleanrl_dir)
    workdir = _WORKDIR.value or tempfile.mkdtemp(prefix="vs_cleanrl-")
    os.makedirs(workdir, exist_ok=True)
    print(f"logs and logdirs in {workdir}", flush=True)
    runs = []
    for seed in seeds:
        cleanrl = run_cleanrl(seed, cleanrl_dir, python, workdir)
        ours = run_ours(seed, workdir)
        runs.append(report_seed(seed, cleanrl, ours))
    result = {
        "bench": "vs_cleanrl",
        "target": TARGET,
        "goal_ratio": 0.5,
        "cleanrl_commit": commit,
        "max_seconds": _MAX_SECONDS.value,
        "runs": runs,
        "median": medians(runs),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    app.run(main)
