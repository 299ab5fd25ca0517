"""What a user sees on the console: progress lines or a live bar, and no other library's
log lines unless --verbose (those go to the file the first console line names)."""

import io
import json
import os
import pty
import re
import select
import subprocess
import sys
import textwrap
import time

import pytest

from gorila_jax import console, metrics

from tests import REPO

# A run small enough to finish in seconds: one actor, a few thousand env steps.
TINY_RUN = [
    "--launcher=local",
    "--num_actors=1",
    "--total_env_steps=1500",
    "--eval_episodes=2",
    "--log_interval_s=1",
    "--checkpoint_interval_steps=0",
]
# Lines other libraries write during every local run (Reverb's C++ log, JAX's backend probe).
NOISE = re.compile(r"reverb/cc/|Started replay server|Unable to initialize backend|xla_bridge")
PROGRESS = re.compile(r"^\[\s*[\d.]+s\] env steps\s+[\d,]+ \| episodes\s+[\d,]+ \| return")
FIRST_LINE = re.compile(r"^gorila-jax: third-party logs go to (\S+) \(--verbose shows them\)$")


def _train(logdir, *flags) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "launch.train", *TINY_RUN, *flags, f"--logdir={logdir}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )


def _train_on_a_terminal(logdir, *flags) -> str:
    """Everything the run writes to a pseudo-terminal (stdout and stderr both)."""
    main, secondary = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "launch.train", *TINY_RUN, *flags, f"--logdir={logdir}"],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        stdout=secondary,
        stderr=secondary,
        env={**os.environ, "TERM": "xterm", "COLUMNS": "160"},
    )
    os.close(secondary)
    chunks, deadline = [], time.monotonic() + 600
    while time.monotonic() < deadline:
        if select.select([main], [], [], 1.0)[0]:
            try:
                data = os.read(main, 65536)
            except OSError:  # the run closed its end
                break
            if not data:
                break
            chunks.append(data)
        elif process.poll() is not None:
            break
    os.close(main)
    assert process.wait(timeout=60) == 0, b"".join(chunks).decode(errors="replace")[-3000:]
    return b"".join(chunks).decode(errors="replace")


@pytest.fixture(scope="module")
def quiet_run(tmp_path_factory):
    logdir = tmp_path_factory.mktemp("quiet")
    return logdir, _train(logdir)


def test_a_run_with_default_flags_names_its_log_file_first_and_keeps_others_lines_there(
    quiet_run,
):
    logdir, result = quiet_run
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    # First what the run's budget made of the preset's schedules (launch/schedules.py):
    # the cartpole preset's, of 120k env steps, fitted to this run's 1,500. Epsilon
    # decays over 2/15 of each actor's steps: 8k of 60k with the preset's 2 actors.
    assert lines[0] == (
        "schedules for 1,500 env steps: learning_rate_decay_steps 188 updates, "
        "importance_exponent_anneal_steps 188 updates, epsilon_decay_steps 200 env steps "
        "per actor"
    )
    with open(logdir / "config.json") as f:
        agent_config = json.load(f)["agent_config"]
    assert agent_config["learning_rate_decay_steps"] == 188
    assert agent_config["epsilon_decay_steps"] == 200
    first = FIRST_LINE.match(lines[1])
    assert first, result.stdout[:500]
    assert first.group(1) == str(logdir / console.THIRD_PARTY_LOG)
    console_text = result.stdout + result.stderr
    assert not NOISE.search(console_text), console_text
    with open(first.group(1)) as f:
        logged = f.read()
    assert "Unable to initialize backend" in logged


def test_progress_without_a_terminal_is_the_plain_lines(quiet_run):
    logdir, result = quiet_run
    lines = result.stdout.splitlines()
    progress = [line for line in lines if PROGRESS.match(line)]
    assert progress, result.stdout
    # One line per metrics row, nothing drawn in place.
    with open(logdir / "metrics.csv") as f:
        assert len(progress) == len(f.readlines()) - 1
    assert "\r" not in result.stdout and "\x1b[" not in result.stdout
    assert lines[-1].startswith("done: ")


def test_a_terminal_gets_a_live_bar_and_verbose_shows_other_libraries_lines(tmp_path):
    output = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", _train_on_a_terminal(tmp_path, "--verbose"))
    assert re.search(r"env steps .*\d+/1500 ETA \d+:\d\d:\d\d", output), output[-3000:]
    assert "env steps/s" in output and "greedy" in output
    assert not PROGRESS.search(output)  # the bar replaces the lines
    assert "Unable to initialize backend" in output  # --verbose: nothing moved to the file
    assert not FIRST_LINE.search(output)
    assert not (tmp_path / console.THIRD_PARTY_LOG).exists()
    assert "done: " in output.rsplit("stopping: ", 1)[-1]  # after the bar ended


_ROUTED = textwrap.dedent(
    """
    import logging, os, sys, warnings
    from gorila_jax import console
    from gorila_jax.learning import checkpoint

    logdir = sys.argv[1]
    console.route_third_party_logs(logdir)
    os.write(2, b"[reverb/cc/platform/default/server.cc:71] Started replay server\\n")
    logging.getLogger("jax._src.xla_bridge").info("Unable to initialize backend 'tpu'")
    logging.getLogger("ray").warning("Token authentication is enabled")
    warnings.warn("a third-party deprecation", DeprecationWarning)
    os.makedirs(os.path.join(checkpoint.learner_dir(logdir), "7"))
    checkpoint.remove_newer(logdir, 3)  # our warning: removing unusable checkpoint
    logging.getLogger("some.library").error("a third-party error")
    print("error: the run's own error line", file=sys.stderr)
    # Ray's errors carry colour codes; the console here is a pipe.
    logging.getLogger("ray").error("\x1b[36mray::NodeActor.construct()\x1b[39m (pid=7)")
    raise RuntimeError("\x1b[36mray::NodeActor.call()\x1b[39m (pid=8) died")
    """
)


def test_routing_keeps_our_warnings_and_every_error_on_the_console(tmp_path):
    result = subprocess.run(
        [sys.executable, "-W", "always", "-c", _ROUTED, str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 1, result.stderr
    shown = result.stdout + result.stderr
    assert "removing unusable checkpoint" in shown
    # Errors and the traceback are shown, without escape codes, on the pipe and in the file.
    assert "ray::NodeActor.construct() (pid=7)" in shown
    assert "RuntimeError: ray::NodeActor.call() (pid=8) died" in shown
    assert "\x1b" not in shown
    assert "a third-party error" in shown
    assert "error: the run's own error line" in shown
    for hidden in ("Started replay server", "Unable to initialize", "Token auth", "deprecation"):
        assert hidden not in shown, shown
    logged = (tmp_path / console.THIRD_PARTY_LOG).read_text()
    for line in ("Started replay server", "Unable to initialize", "Token auth", "deprecation"):
        assert line in logged
    assert "removing unusable checkpoint" in logged  # the file is the whole log
    assert "ray::NodeActor.construct() (pid=7)" in logged and "\x1b" not in logged


def test_a_crash_in_native_code_under_routing_shows_where_on_the_console(tmp_path):
    # fd 2 is the log file under routing; an abort (a C++ CHECK, std::terminate) must
    # still leave the console more than silence.
    crashing = (
        "import os, sys; from gorila_jax import console; "
        "console.route_third_party_logs(sys.argv[1]); os.abort()"
    )
    result = subprocess.run(
        [sys.executable, "-c", crashing, str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == -6
    assert "Fatal Python error: Aborted" in result.stderr, result.stderr
    assert 'File "<string>", line 1' in result.stderr


@pytest.mark.parametrize(
    "line, matters",
    [
        # absl.logging.warning in a Ray worker (what it printed under Ray 2.60).
        ("WARNING:root:removing unusable checkpoint /tmp/run/checkpoints/learner/9", True),
        ("WARNING:absl:replay at 10.0.0.1:5000 does not answer; waiting for it", True),
        ("W1201 18:31:19.274870 1398 sync_learner.py:148] learner/0: restarted from", True),
        ("E1201 18:31:19.274870 1398 server.py:12] anything at ERROR", True),
        ("ERROR:jax._src.xla_bridge:an error of anyone's", True),
        ("WARNING:jax._src.xla_bridge:An NVIDIA GPU may be present on this machine", False),
        ("W1201 18:31:19.274870 1398 xla_bridge.py:895] a third-party warning", False),
        ("I1201 18:31:19.274870 1398 xla_bridge.py:895] Unable to initialize backend 'tpu'", False),
        ("[reverb/cc/platform/default/server.cc:71] Started replay server on port 1", False),
    ],
)
def test_only_our_warnings_and_errors_of_ray_workers_reach_the_console(line, matters):
    assert console.worker_line_matters(line) is matters


def test_the_line_reporter_prints_the_metrics_progress_line(capsys):
    row = {
        "wall_time_s": 3.0,
        "env_steps": 1200,
        "episodes": 40,
        "mean_return": 21.5,
        "eval_return": float("nan"),
        "env_steps_per_s": 400.0,
        "learner_steps_per_s": 12.5,
    }
    with console.progress_reporter(5000) as progress:  # pytest's stdout is no terminal
        progress.message("restarted actor/0 (1/3): no heartbeat")
        progress.poll(row)
        progress.row(row, " | gorila part")
    assert capsys.readouterr().out.splitlines() == [
        "restarted actor/0 (1/3): no heartbeat",
        metrics.progress_line(row) + " | gorila part",
    ]


def test_a_bar_stopped_before_its_budget_ends_on_its_last_state_and_a_newline():
    # A run stopped by --max_wall_time_s or --stop_at_eval_return leaves the loop early.
    out = io.StringIO()
    snapshot = {"env_steps": 600, "mean_return": 31.0, "eval_return": 475.0}
    row = {**snapshot, "env_steps_per_s": 300.0, "learner_steps_per_s": 20.0}
    with console.BarProgress(1000, file=out) as progress:
        progress.poll(snapshot)
        progress.row(row)
    text = out.getvalue()
    assert re.search(r"600/1000 ETA", text), text
    assert "300 env steps/s | 20.0 updates/s" in text and "greedy 475.0" in text
    assert text.endswith("\n")


@pytest.mark.slow
def test_a_ray_runs_library_lines_go_to_the_log_file(tmp_path):
    # Ray's and JAX's start-up lines; what workers print is routed the same way (below).
    result = _train(tmp_path, "--launcher=ray")
    assert result.returncode == 0, result.stderr[-3000:]
    console_text = result.stdout + result.stderr
    assert not NOISE.search(console_text), console_text
    assert "pid=" not in console_text and "Started a local Ray instance" not in console_text
    logged = (tmp_path / console.THIRD_PARTY_LOG).read_text()
    assert "Started a local Ray instance" in logged


_RAY_WORKER = textwrap.dedent(
    """
    import sys, time
    import ray
    from gorila_jax import console
    from gorila_jax.distributed.launchers import ray_cluster

    console.route_third_party_logs(sys.argv[1])
    ray.init(address="local", num_cpus=1, include_dashboard=False)
    ray_cluster._route_worker_logs()

    @ray.remote
    def node():
        import logging, os, tempfile
        from gorila_jax.learning import checkpoint

        logdir = tempfile.mkdtemp()
        os.makedirs(os.path.join(checkpoint.learner_dir(logdir), "9"))
        checkpoint.remove_newer(logdir, 1)  # our warning: removing unusable checkpoint
        logging.getLogger("jax._src.xla_bridge").warning("An NVIDIA GPU may be present")
        print("[reverb/cc/platform/default/server.cc:71] Started replay server", flush=True)

    ray.get(node.remote())
    deadline = time.monotonic() + 60  # Ray forwards a worker's lines a moment later
    while "Started replay server" not in open(console.third_party_log().name).read():
        assert time.monotonic() < deadline, "the worker's lines never arrived"
        time.sleep(0.5)
    ray.shutdown()
    """
)


@pytest.mark.slow
def test_a_ray_workers_warning_of_ours_reaches_the_console_and_the_rest_the_file(tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", _RAY_WORKER, str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": REPO},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    shown = result.stdout + result.stderr
    assert re.search(r"\(node pid=\d+\) WARNING:\w+:removing unusable checkpoint", shown), shown
    assert "NVIDIA" not in shown and "Started replay server" not in shown, shown
    logged = (tmp_path / console.THIRD_PARTY_LOG).read_text()
    assert "An NVIDIA GPU may be present" in logged and "Started replay server" in logged
