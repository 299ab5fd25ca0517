"""A CleanRL script's final training return over seeds, run here beside ours (issue 36).

For each seed, one after the other: CleanRL's `--script` with `--seed=S` and `--peer_args`,
in its venv (bench/cleanrl_peer.py), to the end of its budget. Its final return is the
mean of its last `--last_episodes` training episodes, CleanRL's own figure (the returns
of its stochastic policy, raw rewards from RecordEpisodeStatistics). Ours is the final
greedy evaluation of `launch.sweep` at the same budget; docs/presets.md has both
commands. Prints each seed, then IQM and mean with 95 % CIs (launch/stats.py); the last
line is JSON. Nothing is asserted.

  python bench/peer_returns.py --cleanrl_dir=/tmp/cleanrl --seeds=1,2,3 \\
    --script=cleanrl/ppo_continuous_action.py \\
    --peer_args="--env-id HalfCheetah-v4 --total-timesteps 1000000 --no-cuda"
"""

import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from typing import Any

from absl import app, flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench import cleanrl_peer  # noqa: E402
from launch import stats  # noqa: E402

_CLEANRL_DIR = flags.DEFINE_string("cleanrl_dir", None, "A CleanRL checkout (cleanrl_peer.py).")
_CLEANRL_PYTHON = flags.DEFINE_string(
    "cleanrl_python", None, f"CleanRL's interpreter; unset: {cleanrl_peer.DEFAULT_VENV}."
)
_SCRIPT = flags.DEFINE_string(
    "script", "cleanrl/ppo_continuous_action.py", "The script, relative to the checkout."
)
_PEER_ARGS = flags.DEFINE_string(
    "peer_args", "--env-id HalfCheetah-v4 --total-timesteps 1000000 --no-cuda", "Its arguments."
)
_SEEDS = flags.DEFINE_list("seeds", ["1", "2", "3"], "Seeds, run one after the other.")
_LAST = flags.DEFINE_integer("last_episodes", 10, "Episodes in the final return.", lower_bound=1)
_WORKDIR = flags.DEFINE_string("workdir", None, "Logs; unset: a new temp dir.")


def run_seed(seed: int, cleanrl_dir: str, python: str, workdir: str) -> dict[str, Any]:
    load = cleanrl_peer.print_load(f"CleanRL seed {seed}")
    cwd = os.path.join(workdir, f"seed-{seed}")  # CleanRL writes runs/ into its cwd
    os.makedirs(cwd, exist_ok=True)
    script = os.path.join(cleanrl_dir, _SCRIPT.value)
    command = [python, "-u", script, f"--seed={seed}", *shlex.split(_PEER_ARGS.value)]
    env = dict(os.environ, PYTHONPATH=cleanrl_dir)  # cleanrl_utils, without installing it
    start = time.monotonic()
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    seconds = time.monotonic() - start
    log = os.path.join(workdir, f"seed-{seed}.log")
    with open(log, "w") as f:
        f.write(result.stdout + result.stderr)
    lines = result.stdout.splitlines()
    final, episodes = cleanrl_peer.final_return(lines, _LAST.value)
    sps = [line.split()[-1] for line in lines if line.startswith("SPS:")]
    run = {
        "seed": seed,
        "final_return": final,
        "episodes": episodes,
        "wall_s": round(seconds, 1),
        "last_sps": int(sps[-1]) if sps else None,
        "exit_code": result.returncode,
        "load_before": load,
        "log": log,
    }
    print(json.dumps(run), flush=True)
    return run


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}")
    try:
        seeds = [int(seed) for seed in _SEEDS.value]
        cleanrl_dir, commit = cleanrl_peer.checkout(_CLEANRL_DIR.value, _SCRIPT.value)
        probe = "import gymnasium, torch, tyro, torch.utils.tensorboard"
        python = cleanrl_peer.python(cleanrl_dir, _CLEANRL_PYTHON.value, probe)
    except ValueError as error:  # PeerError, or a seed that is not a number
        raise app.UsageError(str(error)) from None
    workdir = _WORKDIR.value or tempfile.mkdtemp(prefix="peer_returns-")
    os.makedirs(workdir, exist_ok=True)
    print(f"logs in {workdir}", flush=True)
    runs = [run_seed(seed, cleanrl_dir, python, workdir) for seed in seeds]
    finals = [run["final_return"] for run in runs if run["final_return"] is not None]
    estimates = stats.interval_estimates(finals)
    if estimates:
        for name in ("iqm", "mean"):
            e = estimates[name]
            print(f"{name}: {e['estimate']:.1f} [{e['ci_low']:.1f}, {e['ci_high']:.1f}]")
    result = {
        "bench": "peer_returns",
        "script": _SCRIPT.value,
        "peer_args": _PEER_ARGS.value,
        "cleanrl_commit": commit,
        "last_episodes": _LAST.value,
        "runs": runs,
        "estimates": estimates,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    app.run(main)
