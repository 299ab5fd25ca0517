"""launch/setup_env.sh: the set-up that both README commands source."""

import os
import subprocess

from tests import REPO


def _setup(tmp_path, **env):
    # No pyenv on the PATH and an empty home: nothing provides the Python asked for.
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "VENV": str(tmp_path / "venv"), **env}
    return subprocess.run(
        ["bash", os.path.join(REPO, "launch", "setup_env.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_missing_python_is_named_with_what_to_install(tmp_path):
    result = _setup(tmp_path, PYTHON=str(tmp_path / "python3.12"))
    assert result.returncode == 1
    assert "no working python3.12 or python3.13 found" in result.stderr
    assert "pyenv install 3.12" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, "one line says it all"
    assert not (tmp_path / "venv").exists(), "no venv made without the Python it needs"


def test_the_deepmind_set_names_the_python_it_needs(tmp_path):
    result = _setup(tmp_path, DEEPMIND="1", PYTHON=str(tmp_path / "python3.10"))
    assert result.returncode == 1
    assert "no working python3.10 found" in result.stderr
    assert "dm-launchpad 0.5.2 has wheels for Python 3.8-3.10 only" in result.stderr
    assert not (tmp_path / "venv").exists()


def test_the_retired_launchpad_switch_says_what_replaced_it(tmp_path):
    result = _setup(tmp_path, LAUNCHPAD="1")
    assert result.returncode == 2
    assert "LAUNCHPAD=1 is now DEEPMIND=1" in result.stderr
