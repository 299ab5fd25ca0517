"""How the pmapped DQN update scales with learner devices and with learner processes.

On the same global batch (strong scaling), measures updates per second of
  (a) one process over 1, 2 and 4 devices (the learner node's pmapped step), and
  (b) 1 process x 2 devices against 2 jax.distributed processes x 2 devices each
      (gloo collectives over loopback; the multi-host learner's global step),
each in a fresh process whose XLA_FLAGS fix its CPU device count. Efficiency
is speedup / device ratio. Fake CPU devices share the host's cores, so on a
small machine this measures what sharding and collectives cost, not what real
accelerators would gain. Last line: JSON.

  python bench/learner_scaling.py
  python bench/learner_scaling.py --batch_size=1024 --steps=50
"""

import json
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from absl import app, flags  # noqa: E402

_ENV = flags.DEFINE_string("env", "CartPole-v1", "envpool task id (its spec shapes the batch).")
_BATCH = flags.DEFINE_integer("batch_size", 512, "Global batch of every update.", lower_bound=4)
_STEPS = flags.DEFINE_integer("steps", 30, "Timed updates per configuration.", lower_bound=1)
_DEVICES = flags.DEFINE_list("device_counts", ["1", "2", "4"], "Single-process device counts.")
_TIMEOUT = flags.DEFINE_float("timeout_s", 900.0, "Bound on each child process.")
# Child-process flags: one measuring process.
_CHILD = flags.DEFINE_bool("child", False, "Internal: run one measuring process.")
_GLOBAL_STEP = flags.DEFINE_bool("global_step", False, "Internal: use multihost's global step.")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", 1, "Internal: processes in the job.")
_PROCESS_ID = flags.DEFINE_integer("process_id", 0, "Internal: this process's index.")
_COORDINATOR = flags.DEFINE_string("coordinator", "", "Internal: jax.distributed coordinator.")


def _child() -> None:
    """Times `--steps` updates in this process; process 0 prints {"updates_per_s": ...}."""
    from gorila_jax.distributed import multihost

    if _NUM_PROCESSES.value > 1:  # before any other jax call
        group = multihost.ProcessGroup(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
        multihost.initialize(group, timeout_s=int(_TIMEOUT.value))
    import jax

    from agents import dqn
    from bench import timing
    from gorila_jax import builder as builder_lib
    from gorila_jax import envs, parallel
    from gorila_jax.learning import multihost_learner
    from gorila_jax.learning import step as step_lib

    spec = envs.env_spec(_ENV.value)
    builder = dqn.DQNBuilder(dqn.DQNConfig(batch_size=_BATCH.value))
    builder.validate(jax.device_count(), spec)
    local = jax.local_devices()
    # (state, guard): the learner nodes' guarded step carries both.
    state = (
        parallel.replicate(builder_lib.initial_train_state(builder, spec, 0), local),
        parallel.replicate(step_lib.init_guard(), local),
    )
    batch = multihost.process_rows(
        timing.random_batch(builder, spec), _PROCESS_ID.value, _NUM_PROCESSES.value
    )
    batch = parallel.shard_to_devices(batch, local)  # on device once: time the update only
    if _GLOBAL_STEP.value:
        global_step = multihost_learner.make_global_step(builder, spec)
        votes = multihost.stop_votes(False)
        step = lambda s: global_step(s, batch, votes)[:3]  # noqa: E731
    else:
        pmapped = parallel.pmap_step(step_lib.make_step(builder, spec), local, step_lib.OUT_AXES)

        def step(s):
            state, guard, info, published = pmapped(*s, batch)
            return (state, guard), info, published

    for _ in range(2):  # compile and warm up
        state, info, _ = step(state)
    jax.block_until_ready(info)
    start = time.perf_counter()
    for _ in range(_STEPS.value):
        state, info, _ = step(state)
    jax.block_until_ready((state, info))
    rate = _STEPS.value / (time.perf_counter() - start)
    if multihost.is_chief():
        print(json.dumps({"updates_per_s": rate, "devices": jax.device_count()}), flush=True)
    if _NUM_PROCESSES.value > 1:
        multihost.shutdown()


def _run(num_processes: int, devices_per_process: int, global_step: bool) -> float:
    """Starts the measuring process(es); returns process 0's updates per second."""
    from gorila_jax.distributed import multihost

    env = multihost.cpu_device_env(devices_per_process)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH")) if p)
    coordinator = multihost.free_coordinator_address("127.0.0.1")
    common = [
        sys.executable, os.path.abspath(__file__), "--child",
        f"--env={_ENV.value}", f"--batch_size={_BATCH.value}", f"--steps={_STEPS.value}",
        f"--num_processes={num_processes}", f"--coordinator={coordinator}",
        f"--global_step={global_step}", f"--timeout_s={_TIMEOUT.value}",
    ]  # fmt: skip
    children = [
        subprocess.Popen(common + [f"--process_id={i}"], env=env, stdout=subprocess.PIPE, text=True)
        for i in range(num_processes)
    ]
    try:
        outputs = [child.communicate(timeout=_TIMEOUT.value)[0] for child in children]
    finally:
        for child in children:
            child.kill()
    for child in children:
        if child.returncode:
            raise RuntimeError(f"measuring process exited with {child.returncode}")
    result = json.loads(outputs[0].strip().splitlines()[-1])
    assert result["devices"] == num_processes * devices_per_process
    return result["updates_per_s"]


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}")
    if _CHILD.value:
        _child()
        return
    counts = [int(count) for count in _DEVICES.value]
    print(
        f"DQN update, {_ENV.value}, global batch {_BATCH.value}, {_STEPS.value} timed updates, "
        f"{os.cpu_count()} CPU cores"
    )
    by_devices = {count: _run(1, count, global_step=False) for count in counts}
    base = counts[0]
    device_efficiency = {}
    for count, rate in by_devices.items():
        speedup = rate / by_devices[base]
        device_efficiency[count] = speedup / (count / base)
        print(
            f"1 process x {count} devices: {rate:8.1f} updates/s  speedup {speedup:5.2f}  "
            f"efficiency {device_efficiency[count]:5.2f}"
        )
    one = _run(1, 2, global_step=True)
    two = _run(2, 2, global_step=True)
    process_efficiency = (two / one) / 2
    print(f"1 process  x 2 devices (global step): {one:8.1f} updates/s")
    print(
        f"2 processes x 2 devices (jax.distributed, gloo): {two:8.1f} updates/s  "
        f"speedup {two / one:5.2f}  efficiency {process_efficiency:5.2f}"
    )
    print(
        json.dumps(
            {
                "env": _ENV.value,
                "batch_size": _BATCH.value,
                "cpu_cores": os.cpu_count(),
                "updates_per_s_by_devices": {str(k): v for k, v in by_devices.items()},
                "device_efficiency": {str(k): v for k, v in device_efficiency.items()},
                "updates_per_s_1x2_processes": one,
                "updates_per_s_2x2_processes": two,
                "process_efficiency": process_efficiency,
            }
        )
    )


if __name__ == "__main__":
    app.run(main)
