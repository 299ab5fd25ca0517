"""The leak check of tests/conftest.py: a module that leaves a thread or a child process
running fails, naming them; one whose threads and children end soon after its last test
passes."""

import ast
import os
import subprocess
import sys
import textwrap

import psutil

from tests import REPO
from tests import conftest


# The check of the real suite, without its other fixtures and jax setup.
CONFTEST = "from tests.conftest import no_thread_or_child_process_outlives_its_module  # noqa\n"

LEAKY = """
import subprocess
import sys
import threading

def test_starts_a_thread_it_never_stops():
    threading.Thread(target=threading.Event().wait, name="leaky-thread", daemon=True).start()

def test_starts_a_child_it_never_ends(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    with open({pid_file!r}, "w") as out:
        out.write(str(child.pid))
"""

# Ends within the grace period, as a stopped node's threads or Ray's workers do.
TIDY = """
import subprocess
import sys
import threading
import time

def test_starts_a_thread_and_a_child_that_end_soon():
    threading.Thread(target=time.sleep, args=(1.0,), name="short-thread").start()
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.0)"])
"""


def _pytest(directory) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "0", str(directory)],
        cwd=directory,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_module_that_leaves_a_thread_and_a_child_running_fails_naming_them(tmp_path):
    pid_file = tmp_path / "child.pid"
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_leaky.py").write_text(textwrap.dedent(LEAKY.format(pid_file=str(pid_file))))
    result = _pytest(tmp_path)
    assert result.returncode == 1, result.stdout[-3000:]
    assert "2 passed, 1 error" in result.stdout, result.stdout[-3000:]
    assert "test_leaky left running: threads ['leaky-thread']" in result.stdout, result.stdout
    assert "time.sleep(600)" in result.stdout, result.stdout[-3000:]
    # The leftover child was killed, not left to slow the modules after it.
    assert not psutil.pid_exists(int(pid_file.read_text()))


def test_a_module_whose_thread_and_child_end_soon_after_its_last_test_passes(tmp_path):
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_tidy.py").write_text(TIDY)
    result = _pytest(tmp_path)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "1 passed" in result.stdout, result.stdout[-3000:]


def test_every_test_the_scheduler_and_the_leak_check_name_still_exists():
    # Both tables in tests/conftest.py match by name: a renamed test would silently
    # leave the one-at-a-time unit (and run beside the others), or a module's
    # known leftover would excuse nothing.
    test_names, modules = set(), set()
    for folder, _, files in os.walk(os.path.join(REPO, "tests")):
        for name in files:
            if name.startswith("test_") and name.endswith(".py"):
                path = os.path.join(folder, name)
                modules.add(os.path.relpath(path, REPO)[:-3].replace(os.sep, "."))
                with open(path) as f:
                    tree = ast.parse(f.read())
                test_names |= {
                    node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)
                }
    assert conftest.ONE_AT_A_TIME <= test_names, conftest.ONE_AT_A_TIME - test_names
    assert set(conftest.KNOWN_LEFTOVER_THREADS) <= modules
