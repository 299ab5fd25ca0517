"""Where a DQN run's CPU time goes: driver, actors, replay insert and sample, learner, priorities.

Starts a training command (`python -m launch.train --launcher=local ...`: every node is a
thread of one process, so one sampler sees them all), waits until it has taken
`--warmup_env_steps`, then samples its Python threads with py-spy (pinned in
requirements.txt) for `--seconds` and sorts each sample by what its stack is doing.
Shares are of the samples py-spy took of threads it saw active; it also counts a thread
blocked inside native code (a Reverb rate-limiter wait, a tf.data `next`) as active, so
a share is where the node threads are, not CPU. The CPU the whole process used over
the same window (from /proc), per 1000 env steps, is beside it. Each `--variant` is
one run, one after the other, so "before" and "after" share the machine's state.
Last line: JSON.

  python bench/dqn_profile.py --variant=before:--config.updates_per_dispatch=1 \
      --variant=after:
  python bench/dqn_profile.py --variant=reverb:--replay=reverb --variant=native:--replay=native
"""

import collections
import json
import os
import subprocess
import sys
import tempfile
import time

from absl import app, flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_VARIANTS = flags.DEFINE_multi_string(
    "variant",
    ["default:"],
    "name:flags, the flags (space-separated) added to the DQN CartPole-v1 command.",
)
_WARMUP = flags.DEFINE_integer("warmup_env_steps", 15_000, "Env steps before sampling starts.")
_SECONDS = flags.DEFINE_float("seconds", 15.0, "Seconds of sampling.")
_RATE = flags.DEFINE_integer("rate", 100, "py-spy samples per second.")

# (category, substrings of a frame, any of which puts the sample there), first match wins.
# Frames are matched from the innermost outwards, so "Reverb insert" inside an actor
# counts as the insert, not as the actor.
_NATIVE_TABLE = "gorila_jax/replay/native_table.py"
_NATIVE_NODE = "gorila_jax/replay/native_node.py"
CATEGORIES = (
    (
        "replay insert (actor's writer, rate-limiter waits)",
        (
            "replay/writers.py",
            "replay/reverb_writer.py",
            "reverb/trajectory_writer",
            *(f"{fn} ({_NATIVE_NODE}" for fn in ("insert", "write", "_send", "_settle")),
            f"_insert_all ({_NATIVE_NODE}",
            *(f"{fn} ({_NATIVE_TABLE}" for fn in ("insert", "_put", "_put_piece", "_checked")),
        ),
    ),
    ("envpool step", ("envpool/python/envpool.py",)),
    ("actor policy (dispatch and result)", ("acting/actor.py",)),
    (
        "replay sample (Reverb's tf.data or the native sampler, decode, device copy)",
        (
            "replay/shard_streams.py",
            "learning/prefetch.py",
            "replay/codec.py",
            "replay/sharded.py",
            "replay/native_sampler.py",
            f"sample ({_NATIVE_NODE}",
            *(f"{fn} ({_NATIVE_TABLE}" for fn in ("sample", "_draw", "_draw_hot")),
        ),
    ),
    (
        "priority write-back",
        ("PriorityUpdater", "replay/priority_updates.py", f"update ({_NATIVE_TABLE}"),
    ),
    (
        "learner dispatch and update",
        ("learning/learner.py", "learning/sync_learner.py", "learning/replay_learner.py"),
    ),
    ("evaluator", ("acting/evaluation.py",)),
    ("parameter serving", ("get_params", "param_cache.py")),
    (
        "driver (monitor, metrics, console)",
        ("run/experiment.py", "health/", "metrics.py", "console.py"),
    ),
)


def categorize(stack: list[str]) -> str:
    """The category of one py-spy stack (outermost frame first)."""
    for frame in reversed(stack):
        for name, needles in CATEGORIES:
            if any(needle in frame for needle in needles):
                return name
    return "other Python"


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of every thread of `pid` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _env_steps(logdir: str) -> int:
    try:
        with open(os.path.join(logdir, "metrics.csv")) as f:
            last = f.read().strip().splitlines()[-1].split(",")
        return int(float(last[1]))
    except (OSError, IndexError, ValueError):
        return 0


def profile(name: str, extra_flags: list[str]) -> dict:
    logdir = tempfile.mkdtemp(prefix=f"dqn-profile-{name}-")
    command = [sys.executable, "-m", "launch.train", "--launcher=local", "--log_interval_s=1"]
    command += [f"--logdir={logdir}", *extra_flags]
    run = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while _env_steps(logdir) < _WARMUP.value:
            if run.poll() is not None:
                raise RuntimeError(f"{name}: the run ended before {_WARMUP.value} env steps")
            time.sleep(0.5)
        raw = os.path.join(logdir, "py-spy.txt")
        steps_before, cpu_before, start = _env_steps(logdir), _cpu_seconds(run.pid), time.time()
        subprocess.run(
            ["py-spy", "record", "-p", str(run.pid), "-d", str(int(_SECONDS.value))]
            + ["-r", str(_RATE.value), "-f", "raw", "-o", raw, "--threads", "--nonblocking"],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wall, cpu = time.time() - start, _cpu_seconds(run.pid) - cpu_before
        steps = _env_steps(logdir) - steps_before
    finally:
        run.terminate()
        run.wait(120)
    samples: collections.Counter = collections.Counter()
    with open(raw) as f:
        for line in f:
            stack, count = line.rsplit(" ", 1)
            samples[categorize(stack.split(";")[1:])] += int(count)
    total = sum(samples.values())
    shares = {k: v / total for k, v in samples.most_common()}
    return {
        "variant": name,
        "flags": extra_flags,
        "window_s": round(wall, 1),
        "cpu_cores_busy": round(cpu / wall, 2),
        "env_steps_per_s": round(steps / wall),
        "cpu_ms_per_1k_env_steps": round(1000 * cpu / max(steps, 1) * 1000, 1),
        "shares": {k: round(v, 3) for k, v in shares.items()},
    }


def main(argv):
    del argv
    print(f"load average before: {os.getloadavg()}", flush=True)
    results = []
    for variant in _VARIANTS.value:
        name, _, extra = variant.partition(":")
        result = profile(name, extra.split())
        results.append(result)
        print(
            f"{name}: {result['env_steps_per_s']} env steps/s, "
            f"{result['cpu_cores_busy']} cores busy",
            flush=True,
        )
        for category, share in result["shares"].items():
            print(f"  {100 * share:5.1f}%  {category}", flush=True)
    print(json.dumps({"profiles": results}))


if __name__ == "__main__":
    app.run(main)
