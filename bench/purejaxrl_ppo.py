"""Anakin PPO against PureJaxRL's own PPO (luchris429/purejaxrl, `purejaxrl/ppo.py`), one
after the other per seed, at PureJaxRL's CartPole settings: 4 envs x 128 steps, 4 epochs
x 4 minibatches, lr 2.5e-4 annealed to 0, clip 0.2 (values too), entropy 0.01, 64x64 tanh.

PureJaxRL runs from its checkout in its own venv (`bench/purejaxrl-requirements.txt`:
our JAX, flax, optax and gymnax, plus distrax, which its script imports). Each side
reports its compile time, its training time after that, env steps/s over that training
time, and the final greedy return of 10 episodes (PureJaxRL's final parameters are
evaluated here, by the argmax of its own network). Ours is `--launcher=anakin` through
`experiment.run_experiment`, with no evaluations during the run (PureJaxRL has none):
its env steps/s is the run's `loop_env_steps_per_s` (summary.json: the node's clock from
the end of its first device call, which compiles, host work between calls included), its
training time its env steps at that rate, its compile time the time to its first metrics
row with an update. Ours runs with
one XLA:CPU worker thread (`--xla_cpu_threads=1`, docs/anakin.md); PureJaxRL as its script
does, unless `--peer_xla_cpu_threads=1` gives it the same.

  python3.12 -m venv /tmp/pjx-venv
  /tmp/pjx-venv/bin/pip install -r bench/purejaxrl-requirements.txt
  python bench/purejaxrl_ppo.py --purejaxrl_dir=/path/to/purejaxrl --seeds=0,1,2

Last line: JSON.
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402

_ENV = flags.DEFINE_string("env", "CartPole-v1", "gymnax env name (without gymnax/).")
_STEPS = flags.DEFINE_integer("total_env_steps", 500_000, "Env steps of every run.")
_SEEDS = flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds; each runs both sides.")
_PUREJAXRL = flags.DEFINE_string("purejaxrl_dir", None, "PureJaxRL's checkout.")
_PEER_PYTHON = flags.DEFINE_string(
    "peer_python", "/tmp/pjx-venv/bin/python", "The Python of PureJaxRL's venv."
)
_PEER = flags.DEFINE_integer("peer_seed", None, "Internal: run PureJaxRL's side for this seed.")
_ITERATIONS = flags.DEFINE_integer("anakin_iterations_per_call", 32, "Ours: per device call.")
_THREADS = flags.DEFINE_integer(
    "xla_cpu_threads", 1, "Ours: XLA:CPU's worker threads (--xla_cpu_threads; 0: XLA's own)."
)
_PEER_THREADS = flags.DEFINE_integer(
    "peer_xla_cpu_threads", 0, "PureJaxRL's: 0 runs it as its script does; 1 as ours."
)

NUM_ENVS, NUM_STEPS, EPOCHS, MINIBATCHES = 4, 128, 4, 4
EVAL_EPISODES = 10


def peer_side(seed: int) -> dict:
    """PureJaxRL's `make_train`, compiled then run; its final parameters evaluated greedily."""
    import gymnax_episodes  # noqa: PLC0415  beside this script
    import jax  # noqa: PLC0415

    from gorila_jax import xla_cpu  # noqa: PLC0415  os and jax only: its venv has them

    if _PEER_THREADS.value:
        xla_cpu.limit_worker_threads(_PEER_THREADS.value)

    sys.path.insert(0, os.path.join(_PUREJAXRL.value, "purejaxrl"))
    import gymnax  # noqa: PLC0415
    import ppo  # noqa: PLC0415  PureJaxRL's script

    config = {
        "LR": 2.5e-4,
        "NUM_ENVS": NUM_ENVS,
        "NUM_STEPS": NUM_STEPS,
        "TOTAL_TIMESTEPS": _STEPS.value,
        "UPDATE_EPOCHS": EPOCHS,
        "NUM_MINIBATCHES": MINIBATCHES,
        "GAMMA": 0.99,
        "GAE_LAMBDA": 0.95,
        "CLIP_EPS": 0.2,
        "ENT_COEF": 0.01,
        "VF_COEF": 0.5,
        "MAX_GRAD_NORM": 0.5,
        "ACTIVATION": "tanh",
        "ENV_NAME": _ENV.value,
        "ANNEAL_LR": True,
        "DEBUG": False,
    }
    rng = jax.random.PRNGKey(seed)
    start = time.perf_counter()
    train = jax.jit(ppo.make_train(config)).lower(rng).compile()
    compiled = time.perf_counter()
    out = jax.block_until_ready(train(rng))
    trained = time.perf_counter()
    params = out["runner_state"][0].params
    env, env_params = gymnax.make(_ENV.value)
    network = ppo.ActorCritic(env.action_space(env_params).n, activation="tanh")

    def greedy(obs, _key):
        # Its training flattens observations (FlattenObservationWrapper): MinAtar's grids.
        pi, _ = network.apply(params, obs.reshape(obs.shape[0], -1))
        return pi.mode()

    greedy_returns = jax.jit(
        lambda key: gymnax_episodes.episode_returns(env, env_params, greedy, key, EVAL_EPISODES)
    )

    returns = greedy_returns(jax.random.PRNGKey(seed + 1))
    steps = config["TOTAL_TIMESTEPS"] // (NUM_ENVS * NUM_STEPS) * NUM_ENVS * NUM_STEPS
    return {
        "compile_s": compiled - start,
        "train_s": trained - compiled,
        "env_steps_per_s": steps / (trained - compiled),
        "final_eval_return": float(returns.mean()),
    }


def our_side(seed: int) -> dict:
    """The same PPO through `--launcher=anakin`."""
    import csv  # noqa: PLC0415

    from agents import ppo  # noqa: PLC0415
    from gorila_jax.run import experiment  # noqa: PLC0415

    updates = _STEPS.value // (NUM_ENVS * NUM_STEPS)
    config = ppo.PPOConfig(
        torso="mlp",
        hidden_sizes=(64, 64),
        activation="tanh",
        trajectory_length=NUM_STEPS,
        batch_size=NUM_ENVS,
        num_actors=1,
        num_epochs=EPOCHS,
        num_minibatches=MINIBATCHES,
        learning_rate=2.5e-4,
        learning_rate_decay_updates=updates,
        clip_epsilon=0.2,
        value_clip_epsilon=0.2,
        entropy_coef=0.01,
        value_coef=0.5,
        max_grad_norm=0.5,
    )
    with tempfile.TemporaryDirectory() as logdir:
        cfg = experiment.ExperimentConfig(
            env_id="gymnax/" + _ENV.value,
            launcher="anakin",
            logdir=logdir,
            seed=seed,
            total_env_steps=_STEPS.value,
            num_actors=1,
            num_envs_per_actor=NUM_ENVS,
            num_learner_devices=1,
            eval_interval_s=0,
            eval_episodes=EVAL_EPISODES,
            anakin_iterations_per_call=_ITERATIONS.value,
            xla_cpu_threads=_THREADS.value,
            log_interval_s=0.25,
        )
        summary = experiment.run_experiment(ppo.PPOBuilder(config), cfg)
        rows = list(csv.DictReader(open(os.path.join(logdir, "metrics.csv"))))
    # Metrics rows come every log interval with the counters of the latest heartbeat (1 s
    # apart): timed by them, a 3 s run read 4-19 % slow. The node's own clock instead
    # (`loop_env_steps_per_s`: from the end of its first device call, which compiles).
    rate = summary["loop_env_steps_per_s"]
    return {
        "compile_s": next(float(r["wall_time_s"]) for r in rows if float(r["learner_steps"]) > 0),
        "train_s": summary["env_steps"] / rate,
        "env_steps_per_s": rate,
        "final_eval_return": summary["final_eval_return"],
    }


def main(argv: list[str]) -> None:
    del argv
    if _PEER.value is not None:
        print(json.dumps(peer_side(_PEER.value)))
        return
    if not _PUREJAXRL.value:
        raise app.UsageError("--purejaxrl_dir: PureJaxRL's checkout")
    if _THREADS.value:
        # Ours runs in this process: its pool is sized before anything here starts JAX.
        from gorila_jax import xla_cpu  # noqa: PLC0415

        xla_cpu.limit_worker_threads(_THREADS.value)
    runs: dict[str, list[dict]] = {"purejaxrl": [], "anakin": []}
    for seed in map(int, _SEEDS.value):
        peer = subprocess.run(
            [_PEER_PYTHON.value, os.path.abspath(__file__), f"--peer_seed={seed}"]
            + [
                f"--{f}={flags.FLAGS[f].value}"
                for f in ("env", "total_env_steps", "peer_xla_cpu_threads")
            ]
            + [f"--purejaxrl_dir={_PUREJAXRL.value}"],
            capture_output=True,
            text=True,
            check=True,
        )
        runs["purejaxrl"].append(json.loads(peer.stdout.strip().splitlines()[-1]))
        runs["anakin"].append(our_side(seed))
        for side in runs:
            print(f"{side:>9} seed {seed}: {json.dumps(runs[side][-1])}", flush=True)
    medians = {
        side: {name: statistics.median(r[name] for r in results) for name in results[0]}
        for side, results in runs.items()
    }
    ratio = medians["anakin"]["env_steps_per_s"] / medians["purejaxrl"]["env_steps_per_s"]
    for side, figures in medians.items():
        print(f"{side:>9} medians: {json.dumps(figures)}")
    print(f"anakin env steps/s over PureJaxRL's: {ratio:.2f}")
    threads = {"anakin": _THREADS.value, "purejaxrl": _PEER_THREADS.value}
    print(
        json.dumps(
            {
                "medians": medians,
                "anakin_over_purejaxrl": ratio,
                "xla_cpu_threads": threads,
                "runs": runs,
            }
        )
    )


if __name__ == "__main__":
    app.run(main)
