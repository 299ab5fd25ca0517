"""Bytes the learner sends per parameter version, with and without per-host parameter caches.

Two CartPole DQN runs of the same length (`--total_env_steps`) with
`--num_actors` actors on `--num_hosts` simulated hosts: one where every actor
pulls from the learner, one where each host's actors read from their host's
`ParameterCache` (`--param_cache_per_host`). Per run: the learner's
parameter bytes sent (`LearnerNode.params_bytes_served`, the run's last
metrics row) divided by the versions it published (learner steps), and that
in copies of the parameters. The ratio with/without is expected near
hosts / actors: the learner sends each version once per host instead of
once per pulling actor.

`--launcher=local` (the default) runs each program in this process: which
node asks whom for parameters, and so the byte counts, are the same code
paths as under Ray, without 13 processes on a small machine. `--launcher=ray`
runs on a `ray.cluster_utils.Cluster` of `--num_hosts` simulated nodes, one
per host (the placement rule packs each cache with its actors). Evaluations
are off so that only actors read parameters. Last line: JSON.

  python bench/param_cache_bytes.py
  python bench/param_cache_bytes.py --launcher=ray --total_env_steps=16000
"""

import csv
import dataclasses
import json
import os
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from absl import app, flags  # noqa: E402

from agents import dqn  # noqa: E402
from gorila_jax import builder as builder_lib  # noqa: E402
from gorila_jax import envs  # noqa: E402
from gorila_jax.acting import param_cache  # noqa: E402
from gorila_jax.run import experiment  # noqa: E402
from agents.dqn import presets as dqn_presets  # noqa: E402

_ACTORS = flags.DEFINE_integer("num_actors", 8, "Actors in each run.", lower_bound=1)
_HOSTS = flags.DEFINE_integer("num_hosts", 2, "Simulated actor hosts.", lower_bound=1)
_STEPS = flags.DEFINE_integer("total_env_steps", 8_000, "Length of each run.", lower_bound=1)
_ENVS = flags.DEFINE_integer("num_envs_per_actor", 4, "Envs in each actor.", lower_bound=1)
_PULL = flags.DEFINE_integer("param_pull_interval", 5, "Actor steps between pulls.", lower_bound=1)
_LAUNCHER = flags.DEFINE_enum("launcher", "local", ["local", "ray"], "Where nodes run.")
_CPUS_PER_HOST = flags.DEFINE_integer(
    "cpus_per_host", 4, "--launcher=ray: logical CPUs of each simulated node.", lower_bound=1
)


def _builder() -> dqn.DQNBuilder:
    config, _ = dqn_presets.dqn_preset("cartpole")
    return dqn.DQNBuilder(dataclasses.replace(config, min_replay_size=500))


def _experiment(logdir: str, cached: bool) -> experiment.ExperimentConfig:
    actors_per_host = -(-_ACTORS.value // _HOSTS.value)
    return experiment.ExperimentConfig(
        env_id="CartPole-v1",
        launcher=_LAUNCHER.value,
        num_actors=_ACTORS.value,
        num_envs_per_actor=_ENVS.value,
        param_pull_interval=_PULL.value,
        total_env_steps=_STEPS.value,
        num_learner_devices=1,
        eval_interval_s=0,
        eval_episodes=1,
        log_interval_s=1.0,
        heartbeat_interval_s=0.25,
        checkpoint_interval_steps=0,
        # A host's cache and actors fill one simulated node; learner and replay go anywhere.
        cpus_per_actor=(_CPUS_PER_HOST.value - 0.5) / actors_per_host,
        param_cache_cpus=0.5,
        learner_cpus=0,
        replay_cpus=0,
        param_cache_per_host=cached,
        actors_per_host=actors_per_host if cached else 0,
        logdir=logdir,
    )


def _run(builder: dqn.DQNBuilder, cached: bool, param_bytes: int) -> dict:
    logdir = tempfile.mkdtemp(prefix="param-cache-bench-")
    summary = experiment.run_experiment(builder, _experiment(logdir, cached))
    with open(os.path.join(logdir, "metrics.csv")) as f:
        last = list(csv.DictReader(f))[-1]
    with open(os.path.join(logdir, experiment.NODE_STATUS_FILE)) as f:
        nodes = json.load(f)
    sent, versions = float(last["params_bytes_served"]), float(last["learner_steps"])
    caches = {name: n["counters"] for name, n in nodes.items() if name.startswith("param_cache/")}
    actor_versions = [
        n["counters"].get("param_version", -1)
        for name, n in nodes.items()
        if name.startswith("actor/")
    ]
    return {
        "param_cache_per_host": cached,
        "env_steps": float(last["env_steps"]),
        "learner_steps": versions,
        "learner_bytes_sent": sent,
        "bytes_per_version": sent / versions,
        "copies_per_version": sent / versions / param_bytes,
        "bytes_per_env_step": sent / float(last["env_steps"]),
        "caches": caches,
        "min_actor_param_version": min(actor_versions),
        "wall_time_s": summary["wall_time_s"],
    }


def _ray_cluster():
    """`--num_hosts` simulated Ray nodes, joined by this process; the launcher reuses it."""
    import ray
    from ray import cluster_utils

    store = 100 * 2**20
    cluster = cluster_utils.Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": _CPUS_PER_HOST.value,
            "include_dashboard": False,
            "object_store_memory": store,
        },
    )
    for _ in range(_HOSTS.value - 1):
        cluster.add_node(num_cpus=_CPUS_PER_HOST.value, object_store_memory=store)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, runtime_env={"env_vars": {"PYTHONPATH": REPO}})
    return cluster


def main(argv):
    del argv
    builder = _builder()
    spec = envs.env_spec("CartPole-v1")
    state = builder_lib.initial_train_state(builder, spec, 0)
    param_bytes = param_cache.tree_nbytes(builder.state_access.actor_params(state))
    cluster = _ray_cluster() if _LAUNCHER.value == "ray" else None
    try:
        runs = [_run(builder, cached, param_bytes) for cached in (False, True)]
    finally:
        if cluster is not None:
            import ray

            ray.shutdown()
            cluster.shutdown()
    without, with_cache = runs
    ratio = with_cache["bytes_per_version"] / without["bytes_per_version"]
    expected = _HOSTS.value / _ACTORS.value
    print(
        f"{_ACTORS.value} actors on {_HOSTS.value} hosts, {_LAUNCHER.value} launcher, "
        f"{param_bytes:,} parameter bytes per version",
        flush=True,
    )
    for run in runs:
        print(
            f"  cache {'on ' if run['param_cache_per_host'] else 'off'}: "
            f"{run['learner_bytes_sent']:>12,.0f} bytes sent by the learner over "
            f"{run['learner_steps']:,.0f} versions = {run['bytes_per_version']:>10,.0f} "
            f"bytes/version ({run['copies_per_version']:.2f} copies), "
            f"{run['bytes_per_env_step']:,.1f} bytes/env step, "
            f"slowest actor at version {run['min_actor_param_version']}",
            flush=True,
        )
    print(f"  ratio with/without: {ratio:.3f} (hosts/actors = {expected:.3f})", flush=True)
    print(
        json.dumps(
            {
                "bench": "param_cache_bytes",
                "launcher": _LAUNCHER.value,
                "num_actors": _ACTORS.value,
                "num_hosts": _HOSTS.value,
                "total_env_steps": _STEPS.value,
                "param_bytes": param_bytes,
                "without_cache": without,
                "with_cache": with_cache,
                "bytes_per_version_ratio": ratio,
                "expected_ratio": expected,
            }
        )
    )


if __name__ == "__main__":
    app.run(main)
