"""Launch recipes, checked as far as one offline machine can: every `launch.train` command
uses flags that exist with values they accept, every `ray start` option exists, the KubeRay
manifests have KubeRay v1's structure (GPU learners, parameter servers kept apart), and the
Slurm script starts one Ray head and one worker per other node before training.

No Kubernetes API server, KubeRay CRD schema or Slurm is available here, so the manifests
are checked against the field names of KubeRay's v1 Go types (ray-operator/apis/ray/v1) and
the sbatch script runs against recording stand-ins for srun, scontrol, ray and python.
"""

import dataclasses
import json
import pathlib
import re
import shlex
import subprocess

import pytest
import yaml
from absl import flags

from agents import dqn
from gorila_jax import envs
from launch import (
    presets,
    train,  # noqa: F401  defines the flags the recipes must use
)

RECIPES = pathlib.Path(__file__).resolve().parents[2] / "launch" / "recipes"
DOCS = sorted(RECIPES.rglob("*.md"))
KUBERAY = {
    path.name: list(yaml.safe_load_all(path.read_text()))
    for path in (RECIPES / "kuberay").glob("*.yaml")
}

# JSON field names of KubeRay's v1 types (raycluster_types.go, rayjob_types.go), incl. newer ones.
RAY_CLUSTER_SPEC = {
    "headGroupSpec",
    "workerGroupSpecs",
    "rayVersion",
    "enableInTreeAutoscaling",
    "autoscalerOptions",
    "headServiceAnnotations",
    "suspend",
    "managedBy",
    "gcsFaultToleranceOptions",
    "upgradeStrategy",
}
HEAD_GROUP_SPEC = {"serviceType", "headService", "enableIngress", "rayStartParams", "template"}
WORKER_GROUP_SPEC = {
    "groupName",
    "replicas",
    "minReplicas",
    "maxReplicas",
    "numOfHosts",
    "rayStartParams",
    "template",
    "scaleStrategy",
    "suspend",
    "idleTimeoutSeconds",
}
RAY_JOB_SPEC = {
    "activeDeadlineSeconds",
    "backoffLimit",
    "rayClusterSpec",
    "submitterPodTemplate",
    "metadata",
    "clusterSelector",
    "submitterConfig",
    "managedBy",
    "deletionStrategy",
    "entrypoint",
    "runtimeEnvYAML",
    "jobId",
    "submissionMode",
    "entrypointResources",
    "entrypointNumCpus",
    "entrypointNumGpus",
    "ttlSecondsAfterFinished",
    "shutdownAfterJobFinishes",
    "suspend",
    "schedule",
}
_SEPARATORS = {"&&", "||", ";", "|", "&"}


def _ray_start_options() -> set[str]:
    from ray.scripts import scripts

    return {option for param in scripts.start.params for option in param.opts}


def _shell_text(path: pathlib.Path) -> str:
    """The shell a file holds: fenced code blocks of markdown, all of any other file."""
    text = path.read_text()
    if path.suffix == ".md":
        text = "\n".join(re.findall(r"```(?:bash|sh)?\n(.*?)```", text, flags=re.S))
    # Join continued lines, also inside comments ("#   ... \" then "#     --flag").
    return re.sub(r"\\\n[ \t]*#?", " ", text)


def _commands(text: str, program: tuple[str, ...]) -> list[list[str]]:
    """Arguments of every command in `text` that starts with the words `program`."""
    found = []
    for line in text.splitlines():
        try:
            tokens = shlex.split(line.lstrip("# "))
        except ValueError:  # an unbalanced quote in prose
            continue
        for start in range(len(tokens) - len(program) + 1):
            if tuple(tokens[start : start + len(program)]) == program:
                rest = tokens[start + len(program) :]
                cut = next((i for i, t in enumerate(rest) if t in _SEPARATORS), len(rest))
                found.append(rest[:cut])
    return found


def _train_commands(text: str) -> list[list[str]]:
    return _commands(text, ("python", "-m", "launch.train"))


def _check_train_args(args: list[str], where: str) -> dict[str, str]:
    """Asserts every argument is a launch.train flag with a value it accepts; returns them."""
    fields = {field.name for field in dataclasses.fields(dqn.DQNConfig)}
    given = {}
    for arg in args:
        if arg.startswith("$"):  # "$@": the user's own flags
            continue
        assert arg.startswith("--"), f"{where}: {arg!r} is not a flag"
        name, has_value, value = arg[2:].partition("=")
        if name.startswith("config."):
            assert name.removeprefix("config.") in fields, f"{where}: DQNConfig has no {name}"
            continue
        if not has_value and name not in flags.FLAGS and name.startswith("no"):
            name, value = name[2:], "false"
        assert name in flags.FLAGS, f"{where}: launch.train has no flag --{name}"
        given[name] = value if has_value else "true"
        if "$" in value:  # filled in by the shell
            continue
        if has_value:
            flags.FLAGS[name].parser.parse(value)  # raises for a value the flag refuses
        if name == "preset":
            assert value in presets.NAMES, f"{where}: --preset={value} is not a preset"
        if name == "env":
            envs.check_env_id(value)
    return given


@pytest.mark.parametrize("path", DOCS + [RECIPES / "slurm" / "gorila.sbatch"], ids=lambda p: p.name)
def test_every_train_command_in_the_recipes_uses_real_flags(path):
    commands = _train_commands(_shell_text(path))
    if path.name != "README.md":
        assert commands, f"{path.name} shows no launch.train command"
    for args in commands:
        _check_train_args(args, path.name)


@pytest.mark.parametrize("path", DOCS + [RECIPES / "slurm" / "gorila.sbatch"], ids=lambda p: p.name)
def test_every_ray_start_option_in_the_recipes_exists(path):
    known = _ray_start_options()
    for args in _commands(_shell_text(path), ("ray", "start")):
        for arg in args:
            if arg.startswith("--"):
                assert arg.split("=")[0] in known, f"{path.name}: ray start has no {arg}"


def test_the_checks_catch_a_wrong_flag_a_bad_value_and_a_wrong_preset():
    with pytest.raises(AssertionError, match="no flag --num_actor"):
        _check_train_args(["--num_actor=4"], "example")
    with pytest.raises(ValueError):
        _check_train_args(["--num_actors=0"], "example")  # lower_bound=1
    with pytest.raises(AssertionError, match="--preset=pong is not a preset"):
        _check_train_args(["--preset=pong"], "example")
    with pytest.raises(ValueError, match="unknown env id"):
        _check_train_args(["--env=Pong-v4"], "example")


def test_recipe_links_point_at_files_that_exist():
    for doc in DOCS:
        for target in re.findall(r"\]\(([^)#]+)\)", doc.read_text()):
            if "://" not in target:
                assert (doc.parent / target).exists(), f"{doc.name} links to missing {target}"


def _documents(kind: str) -> list[dict]:
    return [doc for docs in KUBERAY.values() for doc in docs if doc and doc["kind"] == kind]


def _pod_specs(cluster_spec: dict) -> dict[str, dict]:
    """Pod template of the head ("head") and of each worker group, by group name."""
    pods = {"head": cluster_spec["headGroupSpec"]["template"]}
    pods.update({g["groupName"]: g["template"] for g in cluster_spec["workerGroupSpecs"]})
    return pods


def _quantity(value) -> float:
    """A Kubernetes CPU/GPU quantity: 4, "4", "500m"."""
    value = str(value)
    return float(value[:-1]) / 1000 if value.endswith("m") else float(value)


def _check_cluster_spec(spec: dict, where: str) -> None:
    import ray

    assert set(spec) <= RAY_CLUSTER_SPEC, f"{where}: unknown fields {set(spec) - RAY_CLUSTER_SPEC}"
    assert spec["rayVersion"] == ray.__version__, f"{where}: rayVersion differs from the pinned Ray"
    head = spec["headGroupSpec"]
    assert set(head) <= HEAD_GROUP_SPEC and {"rayStartParams", "template"} <= set(head)
    names = [group["groupName"] for group in spec["workerGroupSpecs"]]
    assert len(names) == len(set(names)), f"{where}: worker group names repeat"
    for group in spec["workerGroupSpecs"]:
        assert set(group) <= WORKER_GROUP_SPEC, f"{where}: {set(group) - WORKER_GROUP_SPEC}"
        assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"], group["groupName"]
    known_options = _ray_start_options()
    for group in [head] + spec["workerGroupSpecs"]:
        for key, value in group["rayStartParams"].items():
            assert f"--{key}" in known_options, f"{where}: ray start has no --{key}"
            if key == "resources":  # KubeRay wants a quoted JSON object
                assert isinstance(json.loads(json.loads(value)), dict)
    for name, pod in _pod_specs(spec).items():
        mounts = set()
        for container in pod["spec"]["containers"]:
            assert container["name"] and container["image"], f"{where}/{name}: container"
            requests, limits = container["resources"]["requests"], container["resources"]["limits"]
            assert requests.get("nvidia.com/gpu") == limits.get("nvidia.com/gpu")  # K8s rule
            mounts |= {mount["name"] for mount in container.get("volumeMounts", [])}
        volumes = {volume["name"] for volume in pod["spec"].get("volumes", [])}
        assert mounts <= volumes, f"{where}/{name}: mounts {mounts - volumes} have no volume"


@pytest.mark.parametrize("kind", ["RayCluster", "RayJob"])
def test_kuberay_manifests_have_the_v1_structure(kind):
    (doc,) = _documents(kind)
    assert doc["apiVersion"] == "ray.io/v1" and doc["metadata"]["name"]
    if kind == "RayJob":
        assert set(doc["spec"]) <= RAY_JOB_SPEC, set(doc["spec"]) - RAY_JOB_SPEC
        _check_cluster_spec(doc["spec"]["rayClusterSpec"], kind)
    else:
        _check_cluster_spec(doc["spec"], kind)
    claims = {c["metadata"]["name"] for c in _documents("PersistentVolumeClaim")}
    spec = doc["spec"].get("rayClusterSpec", doc["spec"])
    for pod in _pod_specs(spec).values():
        for volume in pod["spec"].get("volumes", []):
            if "persistentVolumeClaim" in volume:
                assert volume["persistentVolumeClaim"]["claimName"] in claims


@pytest.mark.parametrize("kind", ["RayCluster", "RayJob"])
def test_learners_get_gpus_and_parameter_servers_never_share_a_machine(kind):
    (doc,) = _documents(kind)
    pods = _pod_specs(doc["spec"].get("rayClusterSpec", doc["spec"]))
    (learner,) = pods["learner"]["spec"]["containers"]
    assert _quantity(learner["resources"]["limits"]["nvidia.com/gpu"]) >= 1
    ps = pods["parameter-server"]
    terms = ps["spec"]["affinity"]["podAntiAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    own_labels = ps["metadata"]["labels"]
    assert any(
        term["topologyKey"] == "kubernetes.io/hostname"
        and term["labelSelector"]["matchLabels"].items() <= own_labels.items()
        for term in terms
    ), "parameter-server pods need required anti-affinity against each other per host"


def test_rayjob_entrypoint_trains_with_real_flags_and_fits_its_cluster():
    (job,) = _documents("RayJob")
    (args,) = _train_commands(job["spec"]["entrypoint"])
    given = _check_train_args(args, "rayjob entrypoint")
    assert given["ray_address"] == "auto"  # join the cluster KubeRay made, never a private one

    def setting(name):
        return float(given.get(name, flags.FLAGS[name].default))

    gorila = given.get("learner_mode") == "gorila"
    learners = setting("num_learners") if gorila else 1
    gpus_wanted = learners * setting("learner_gpus")
    cpus_wanted = (
        setting("num_actors") * setting("cpus_per_actor")
        + setting("replay_cpus")
        + learners * setting("learner_cpus")
        + (setting("num_ps_shards") * setting("ps_cpus") if gorila else 0)
    )
    spec = job["spec"]["rayClusterSpec"]
    groups = [dict(spec["headGroupSpec"], replicas=1)] + spec["workerGroupSpecs"]
    gpus = cpus = 0.0
    for group in groups:
        (container,) = group["template"]["spec"]["containers"]
        limits = container["resources"]["limits"]
        # Ray's CPUs on a pod: its num-cpus start parameter, else the pod's CPU limit.
        pod_cpus = _quantity(group["rayStartParams"].get("num-cpus", limits["cpu"]))
        cpus += group["replicas"] * pod_cpus
        gpus += group["replicas"] * _quantity(limits.get("nvidia.com/gpu", 0))
    assert gpus_wanted <= gpus and cpus_wanted <= cpus, (gpus_wanted, gpus, cpus_wanted, cpus)


def test_sbatch_script_is_valid_bash():
    subprocess.run(["bash", "-n", str(RECIPES / "slurm" / "gorila.sbatch")], check=True)


_STAND_IN = """#!/bin/bash
echo "{name} $*" >> "$CALLS"
{body}
"""


def test_sbatch_starts_a_head_then_a_worker_per_node_then_trains(tmp_path):
    """Runs the script with srun, scontrol, ray, python and sleep replaced by recorders.

    (That the head starts before the workers dial it, and the workers before
    training, rests on the script's sleeps, which a recorder cannot check.)
    """
    bin_dir, repo = tmp_path / "bin", tmp_path / "repo"
    (repo / ".venv" / "bin").mkdir(parents=True)
    (repo / ".venv" / "bin" / "activate").write_text("")
    bin_dir.mkdir()
    bodies = {
        "srun": 'case "$*" in *hostname*) echo "10.1.2.3 fe80::1";; esac',
        "scontrol": "printf 'gpu-a\\ngpu-b\\ngpu-c\\n'",
        "ray": 'case "$1" in get-auth-token) echo token-123;; esac',
        "python": "exit 0",
        "sleep": "exit 0",
    }
    for name, body in bodies.items():
        path = bin_dir / name
        path.write_text(_STAND_IN.format(name=name, body=body))
        path.chmod(0o755)
    calls = tmp_path / "calls.log"
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "CALLS": str(calls),
        "HOME": str(tmp_path),
        "GORILA_REPO": str(repo),
        "SLURM_JOB_NODELIST": "gpu-[a-c]",
        "SLURM_JOB_ID": "77",
        "SLURM_SUBMIT_DIR": str(repo),
        "SLURM_CPUS_PER_TASK": "32",
        "SLURM_GPUS_PER_TASK": "1",
    }
    script = RECIPES / "slurm" / "gorila.sbatch"
    subprocess.run(
        ["bash", str(script), "--env=Pong-v5", "--num_actors=40"],
        env=env,
        check=True,
        timeout=60,
        capture_output=True,
    )
    lines = calls.read_text().splitlines()
    # The srun steps run in the background, so their log lines may come in any order.
    starts = [line for line in lines if line.startswith("srun") and "ray start" in line]
    (head,) = [line for line in starts if "--head" in line]
    assert "-w gpu-a ray start --head --node-ip-address=10.1.2.3 --port=6379" in head
    workers = {line.split(" -w ")[1].split()[0]: line for line in starts if line != head}
    assert set(workers) == {"gpu-b", "gpu-c"}
    for node, line in workers.items():
        assert f"-w {node} ray start --address=10.1.2.3:6379 --num-cpus=32 --num-gpus=1" in line
    (train_line,) = [line for line in lines if line.startswith("python")]
    args = shlex.split(train_line)[3:]
    given = _check_train_args(args, "sbatch")
    assert given["ray_address"] == "10.1.2.3:6379" and given["logdir"].endswith("slurm-77")
    assert args[-2:] == ["--env=Pong-v5", "--num_actors=40"]  # the user's flags come last, win
