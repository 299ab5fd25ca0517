"""bench/gpu_check.sh and requirements-gpu.txt, checked where no GPU is: the script's
stages run on CPU (--cpu_smoke) and report, and its refusals say why."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "bench", "gpu_check.sh")


def _pins(path: str) -> dict[str, str]:
    """name -> version of every requirement line of `path` (not its comments or -r lines)."""
    pins = {}
    with open(os.path.join(REPO, path)) as f:
        for line in f:
            line = line.split("#")[0].strip()
            if not line or line.startswith("-r "):
                continue
            match = re.fullmatch(r"([A-Za-z0-9_.\-]+)==([A-Za-z0-9_.+\-]+)", line)
            assert match, f"{path}: {line!r} is not pinned as name==version"
            pins[re.sub(r"[-_.]+", "-", match[1].lower())] = match[2]
    return pins


def test_the_gpu_set_is_the_cpu_set_plus_the_cuda_plugin_of_the_same_jax():
    cpu, gpu = _pins("requirements.txt"), _pins("requirements-gpu.txt")
    with open(os.path.join(REPO, "requirements-gpu.txt")) as f:
        assert "-r requirements.txt" in f.read().splitlines()
    assert not set(cpu) & set(gpu), "a package pinned in both files: one pin per package"
    assert gpu["jax-cuda12-plugin"] == gpu["jax-cuda12-pjrt"] == cpu["jax"] == cpu["jaxlib"]
    # jax-cuda12-plugin[with_cuda] 0.11.2 requires these; each must be pinned here.
    for name in ("cublas", "cuda-cupti", "cuda-nvcc", "cuda-runtime", "cudnn", "cufft"):
        assert f"nvidia-{name}-cu12" in gpu
    for name in ("cusolver", "cusparse", "nccl", "nvjitlink"):
        assert f"nvidia-{name}-cu12" in gpu


def _script(args: list[str], env: dict | None = None, timeout: float = 60):
    return subprocess.run(
        [shutil.which("bash"), SCRIPT, *args],
        cwd=REPO,
        env=env or os.environ,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_a_host_without_an_nvidia_driver_is_refused_before_anything_installs(tmp_path):
    # A PATH with only what the script needs before its driver check: no nvidia-smi.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("dirname", "mkdir"):
        os.symlink(shutil.which(tool), bin_dir / tool)
    out = tmp_path / "out"
    result = _script([f"--out={out}"], env={"PATH": str(bin_dir)})
    assert result.returncode == 1
    assert "nvidia-smi not found" in result.stderr
    assert sorted(os.listdir(out)) == ["stages.tsv"] and not (out / "stages.tsv").read_text()


@pytest.mark.parametrize(
    "arg, message",
    [("--budget=9", "unknown argument --budget=9"), ("--learn_seconds=soon", "whole number")],
)
def test_bad_arguments_are_named(arg, message, tmp_path):
    result = _script([arg, f"--out={tmp_path}"])
    assert result.returncode == 2
    assert message in result.stderr


def test_require_gpu_on_a_cpu_host_says_what_is_missing():
    result = subprocess.run(
        [sys.executable, "bench/gpu_learner.py", "--check_devices", "--require_gpu"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,  # a liveness bound: importing TensorFlow on a loaded machine is slow
    )
    assert result.returncode == 1
    assert "JAX's default backend is 'cpu', not 'gpu'" in result.stderr
    assert "requirements-gpu.txt" in result.stderr


# Extended: it proves a GPU host's script still runs its stages, no claim of the CPU
# suite, and its 10 learner compiles cost minutes of CI's 2 cores.
@pytest.mark.extended
@pytest.mark.timeout(1500)  # above the smoke run's own bound, 1200 s: a liveness bound
def test_cpu_smoke_runs_every_stage_and_ends_with_one_json_report(tmp_path):
    # The suite's venv and interpreter; conftest's 4 CPU devices reach the bench by XLA_FLAGS.
    env = {**os.environ, "VENV": sys.prefix, "PYTHON": sys.executable}
    result = _script(["--cpu_smoke", f"--out={tmp_path}"], env=env, timeout=1400)
    lines = result.stdout.strip().splitlines()
    assert lines, result.stderr[-4000:]
    report = json.loads(lines[-1])
    assert result.returncode == 0 and report["status"] == "ok", result.stderr[-4000:]
    assert report["mode"] == "cpu_smoke" and report["failed_stages"] == []
    assert report["devices"]["backend"] == "cpu" and report["devices"]["compute_check"]
    assert report["learner_complete"]
    measured = {(r["agent"], r["mode"], r["devices"]) for r in report["learner"]}
    every_mode = {(a, m, 4) for a in ("dqn", "ppo") for m in ("fp32", "bf16", "tf32")}
    assert measured == every_mode | {("dqn", "fp32", 1), ("ppo", "fp32", 1)}
    for row in report["learner"]:
        assert row["updates_per_s"] > 0 and row["nonfinite_skipped_steps"] == 0, row
    assert {r["samples_per_update"] for r in report["learner"]} == {8, 4 * 8}
    run = report["learning_run"]
    assert run["stop_reason"] == "total_env_steps reached", run
    assert run["env_steps"] > 0 and run["learner_steps"] > 0 and run["env_steps_per_s"] > 0
    assert run["final_eval_episodes"] == 10 and isinstance(run["final_eval_return"], float)
    assert set(report["stages"]) == {"devices", "learner", "learn"}
