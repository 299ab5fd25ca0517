"""bench/gpu_check.sh and requirements-gpu.txt, checked where no GPU is: the script's
stages run on CPU (--cpu_smoke) and report, and its refusals say why."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from tests import REPO

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
    assert set(report["stages"]) == {"devices", "learner", "actors", "learn"}


def test_the_recorded_learner_specs_are_envpools():
    from bench import recorded_specs
    from gorila_jax import envs

    for env_id, recorded in recorded_specs.RECORDED_SPECS.items():
        assert recorded == envs.env_spec(env_id), env_id


def _offline_wheels(tmp_path) -> str:
    """The wheels of `bench/gpu_wheels.py`, built from this venv's packages (no network)."""
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "bench/gpu_wheels.py", f"--out={wheels}", "--from_installed"],
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=300,
    )
    return str(wheels)


def test_the_offline_wheels_fit_beside_the_repository_and_step_pong_alone(tmp_path):
    wheels = _offline_wheels(tmp_path)
    sizes = sum(os.path.getsize(os.path.join(wheels, name)) for name in os.listdir(wheels))
    assert sizes < 20 * 2**20, f"{sizes / 2**20:.1f} MiB of wheels"
    site = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-index",
            "--no-deps",
            "--quiet",
            f"--target={site}",
            *sorted(os.path.join(wheels, n) for n in os.listdir(wheels)),
        ],
        check=True,
        timeout=300,
    )
    assert not (site / "envpool" / "mujoco" / "mujoco_gym_envpool.so").exists(), "cut down"
    # The cut-down envpool, ahead of this venv's full one, steps Pong with the one ROM kept.
    step_pong = (
        "import envpool, numpy as np; assert envpool.__file__.startswith(%r), envpool.__file__; "
        "env = envpool.make('Pong-v5', env_type='gymnasium', num_envs=2); env.reset(); "
        "obs = env.step(np.zeros(2, np.int32))[0]; print(obs.shape, obs.dtype)"
    ) % str(site)
    result = subprocess.run(
        [sys.executable, "-c", step_pong],
        env={**os.environ, "PYTHONPATH": str(site)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "(2, 4, 84, 84) uint8"


@pytest.mark.slow
@pytest.mark.timeout(1500)  # above the smoke run's own bound, 1200 s: a liveness bound
def test_the_offline_cpu_smoke_runs_every_stage_from_the_wheels_alone(tmp_path):
    wheels = _offline_wheels(tmp_path)
    # No package index is reachable: whatever the script would fetch fails.
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
        "PIP_FIND_LINKS": "",
        "HTTPS_PROXY": "http://127.0.0.1:9",
    }
    out = tmp_path / "out"
    result = _script(
        ["--cpu_smoke", "--offline", f"--wheels={wheels}", f"--out={out}"], env=env, timeout=1400
    )
    lines = result.stdout.strip().splitlines()
    assert lines, result.stderr[-4000:]
    report = json.loads(lines[-1])
    assert result.returncode == 0 and report["status"] == "ok", result.stderr[-4000:]
    assert report["offline"] and report["mode"] == "cpu_smoke"
    assert set(report["stages"]) == {"install", "devices", "learner", "actors", "learn"}
    # The learner ran with envpool, Ray and Reverb unimportable (bench/without.py).
    assert "bench/without.py envpool,ray,reverb,tensorflow" in result.stderr
    assert {(r["agent"], r["mode"]) for r in report["learner"]} == {
        ("dqn", "fp32"),
        ("ppo", "fp32"),
    }
    actors = report["actors"]
    assert actors["raw_envpool_steps_per_s"] > 0 and actors["native"]["actor_env_steps_per_s"] > 0
    run = report["learning_run"]
    assert run["stop_reason"] == "total_env_steps reached", run
    assert run["final_eval_episodes"] == 10 and isinstance(run["final_eval_return"], float)
    assert (out / "site" / "envpool").is_dir()
