"""launch/setup_env.sh: the set-up that both README commands source."""

import os
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_a_missing_python_is_named_with_what_to_install(tmp_path):
    # No pyenv on the PATH and an empty home: nothing provides Python 3.10.
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "LAUNCHPAD": "1",
        "PYTHON": str(tmp_path / "python3.10"),
        "VENV": str(tmp_path / "venv"),
    }
    result = subprocess.run(
        ["bash", os.path.join(REPO, "launch", "setup_env.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert "no working python3.10 found" in result.stderr
    assert "dm-launchpad 0.5.2 has wheels for Python 3.8-3.10 only" in result.stderr
    assert "pyenv install 3.10" in result.stderr
    assert not (tmp_path / "venv").exists(), "no venv made without the Python it needs"
