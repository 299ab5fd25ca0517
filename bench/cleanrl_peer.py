"""CleanRL run here as a peer (bench/vs_cleanrl.py, bench/peer_returns.py): the commit the
figures refer to, its venv, and its episode lines.

CleanRL is not part of this repository; get that commit with

  git clone https://github.com/vwxyzjn/cleanrl /tmp/cleanrl
  git -C /tmp/cleanrl checkout fe8d8a03c41a7ef5b523e2e354bd01c363e786bb
"""

import os
import re
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLEANRL_COMMIT = "fe8d8a03c41a7ef5b523e2e354bd01c363e786bb"
CLEANRL_REQUIREMENTS = os.path.join(REPO, "bench", "cleanrl-requirements.txt")
DEFAULT_VENV = "/tmp/cleanrl-venv"

# global_step=2814, episodic_return=[500.]  (gymnasium 0.29 prints the return as an array)
_EPISODE = re.compile(r"global_step=(\d+), episodic_return=\[?\s*([-+\d.eE]+)\s*\]?")


class PeerError(ValueError):
    """CleanRL cannot run as asked (no checkout, no working interpreter)."""


def parse_episode(line: str) -> tuple[int, float] | None:
    """(env steps taken, episode return) of one of CleanRL's episode lines, else None."""
    match = _EPISODE.search(line)
    if not match:
        return None
    return int(match.group(1)) + 1, float(match.group(2))  # global_step counts from 0


def final_return(lines: list[str], last: int) -> tuple[float | None, int]:
    """The mean return of the last `last` episodes in CleanRL's output, and how many
    episodes it printed (None: none)."""
    returns = [episode[1] for episode in map(parse_episode, lines) if episode]
    if not returns:
        return None, 0
    recent = returns[-last:]
    return sum(recent) / len(recent), len(returns)


def print_load(what: str) -> list[float]:
    """Prints `uptime` (its load average) before a run; returns the three load averages."""
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"before {what}: {uptime}", flush=True)
    return list(os.getloadavg())


def checkout(cleanrl_dir: str | None, script: str) -> tuple[str, str | None]:
    """The checkout's absolute path and its commit (a note is printed if it is not
    `CLEANRL_COMMIT`).

    Raises:
      PeerError: no checkout with `script` there.
    """
    path = os.path.abspath(cleanrl_dir or "")
    if not cleanrl_dir or not os.path.isfile(os.path.join(path, script)):
        raise PeerError(
            f"--cleanrl_dir must be a CleanRL checkout with {script} (got {cleanrl_dir!r}); "
            "see bench/cleanrl_peer.py for how to get one"
        )
    git = ["git", "-C", path, "rev-parse", "HEAD"]
    commit = subprocess.run(git, capture_output=True, text=True).stdout.strip() or None
    if commit != CLEANRL_COMMIT:
        print(f"note: {path} is at {commit}, not {CLEANRL_COMMIT}", flush=True)
    return path, commit


def python(cleanrl_dir: str, given: str | None, probe: str) -> str:
    """CleanRL's interpreter: `given`, or the default venv's, made from
    bench/cleanrl-requirements.txt if missing; checked by importing `probe`'s modules.

    Raises:
      PeerError: `given` does not exist, or the interpreter cannot import them.
    """
    interpreter = given or os.path.join(DEFAULT_VENV, "bin", "python")
    if not os.path.exists(interpreter):
        if given:
            raise PeerError(f"--cleanrl_python: no such file {interpreter}")
        print(f"making {DEFAULT_VENV} from {CLEANRL_REQUIREMENTS} (a few minutes)", flush=True)
        subprocess.run([sys.executable, "-m", "venv", DEFAULT_VENV], check=True)
        pip = [interpreter, "-m", "pip", "install", "-q", "-r", CLEANRL_REQUIREMENTS]
        subprocess.run(pip, check=True)
    env = dict(os.environ, PYTHONPATH=cleanrl_dir)
    result = subprocess.run([interpreter, "-c", probe], env=env, capture_output=True, text=True)
    if result.returncode:
        tail = result.stderr.strip().splitlines()[-1:] or ["?"]
        raise PeerError(
            f"{interpreter} cannot run CleanRL ({tail[0]}); "
            "install bench/cleanrl-requirements.txt into it"
        )
    return interpreter
