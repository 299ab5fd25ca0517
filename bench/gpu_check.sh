#!/usr/bin/env bash
# One command on a GPU host: check that JAX computes on the GPU, time the learners and the
# actor pipeline, run a short Pong learning run, and print one JSON line last.
#
#   bash bench/gpu_check.sh --offline --wheels=DIR   # an air-gapped node: its site Python
#   bash bench/gpu_check.sh                # a host with PyPI: install the GPU set first
#   bash bench/gpu_check.sh --cpu_smoke    # the same stages on CPU, tiny budgets (tests run it)
#   bash bench/gpu_check.sh -- --num_envs_per_actor=16   # flags after -- go to launch.train
#
# --offline: a host with no package index, whose Python 3.12 (PYTHON=, default python3.12)
# has JAX 0.11 or newer with its CUDA plugin, flax, optax, chex, numpy 2, absl-py, rich and
# matplotlib installed by the site. What else the project needs comes as wheels in DIR,
# which `python bench/gpu_wheels.py --out=DIR` (bench/gpu_wheels.sh) makes on a machine
# with internet: about 10 MiB, envpool and its ROMs cut down to Pong. Nothing is downloaded.
# Online: Linux x86_64, python3.12, PyPI reachable (about 3.6 GB of wheels, 2.8 GB of them
# CUDA's). Both need an NVIDIA driver (nvidia-smi). Stages, each bounded by its own limit
# and by what is left of --budget_s (default 450 s, so the whole script ends within 8 min):
#   install  online: python3.12 venv $VENV (default .venv-gpu), requirements-gpu.txt by uv
#            (pinned; pip if uv will not install); skipped when the venv is up to date.
#            --offline: DIR's wheels by `pip install --no-index --no-deps --target`
#   devices  JAX's default backend must be 'gpu', and a conv and a matmul run there
#   learner  bench/gpu_learner.py: DQN and PPO updates/s on Pong-v5 shapes in fp32, bf16
#            and TF32, pmapped over the devices present; run with envpool, Ray and Reverb
#            made unimportable (bench/without.py): a learner needs none of them
#   actors   bench/actor_throughput.py on Pong-v5: one actor node's env steps/s against raw
#            envpool, with as many envs and threads as the host has cores
#   learn    python -m launch.train --agent=ppo --env=Pong-v5 (preset auto) for what is
#            left, at most --learn_seconds of driving (--launcher=local offline: no Ray);
#            final greedy return and env steps/s
# Logs: runs/gpu_check/<stage>.log (--out). Exit code 0 only if every stage passed.
set -uo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SMOKE=0 OFFLINE=0 WHEELS= BUDGET_S= OUT="$REPO/runs/gpu_check"
LEARN_AGENT=ppo LEARN_ENV=Pong-v5 LEARN_S=150 LEARN_ACTORS=12 LAUNCHER=ray
BENCH_ARGS=(--env=Pong-v5 --seconds=3)
TRAIN_ARGS=()
while (($#)); do
  case "$1" in
    --cpu_smoke) SMOKE=1 ;;
    --offline) OFFLINE=1 ;;
    --wheels=*) WHEELS="${1#*=}" ;;
    --budget_s=*) BUDGET_S="${1#*=}" ;;
    --out=*) OUT="${1#*=}" ;;
    --learn_agent=*) LEARN_AGENT="${1#*=}" ;;
    --learn_env=*) LEARN_ENV="${1#*=}" ;;
    --learn_seconds=*) LEARN_S="${1#*=}" ;;
    --learn_actors=*) LEARN_ACTORS="${1#*=}" ;;
    --) shift; TRAIN_ARGS=("$@"); break ;;
    *) echo "error: unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
  esac
  shift
done
# On a GPU host the stages must fit in 8 minutes; a smoke run's CPU times say nothing, so
# there the budget is generous and is the only bound (a loaded CI machine is slow).
BUDGET_S="${BUDGET_S:-$((SMOKE ? 1200 : 450))}"
for value in "$BUDGET_S" "$LEARN_S" "$LEARN_ACTORS"; do
  if ! [[ "$value" =~ ^[0-9]+$ ]]; then
    echo "error: $value: budgets and counts are whole numbers" >&2
    exit 2
  fi
done
if ((OFFLINE)) && [ ! -d "$WHEELS" ]; then
  echo "error: --offline needs --wheels=DIR, a directory of wheels (bench/gpu_wheels.py makes it)" >&2
  exit 2
fi
if ((!OFFLINE)) && [ -n "$WHEELS" ]; then
  echo "error: --wheels is for --offline; online, requirements-gpu.txt is installed" >&2
  exit 2
fi
CORES="$(nproc 2>/dev/null || echo 4)"
ACTOR_ARGS=(--env=Pong-v5 --num_envs=$((2 * CORES)) --env_threads="$CORES" --seconds=10
  --replays=native)
if ((SMOKE)); then
  # Plumbing only: the CI venv, CartPole shapes (compiles in seconds on CPU), tiny batches,
  # fp32 alone (each precision is another compile of minutes on 2 loaded cores).
  # The local launcher: Ray's start-up wait (30 s) runs out on a loaded CI machine. The
  # run ends at 40k env steps, well past what actors ran ahead of PPO's first update (14k
  # steps with 1 update, measured on the loaded machine); its wall time is only a bound.
  VENV="${VENV:-$REPO/.venv}" LEARN_ENV=CartPole-v1 LEARN_S=600 LEARN_ACTORS=2 LAUNCHER=local
  TRAIN_ARGS=(--total_env_steps=40000 "${TRAIN_ARGS[@]}")
  BENCH_ARGS=(--env=CartPole-v1 --seconds=0.2 --dqn_batch_size=8 --ppo_chunks=4
    --ppo_trajectory_length=8)
  ((OFFLINE)) && BENCH_ARGS+=(--modes=fp32)
  ACTOR_ARGS=(--env=CartPole-v1 --num_envs=4 --env_threads=1 --seconds=0.5 --replays=native)
fi
if ((OFFLINE)); then
  # The site Python itself (the smoke test's: its venv's), no venv of our own.
  LAUNCHER=local
  if ((SMOKE)); then PY="${PYTHON:-${VENV:-$REPO/.venv}/bin/python}"; else PY="${PYTHON:-python3.12}"; fi
  PYTHON="$PY"
else
  PYTHON="${PYTHON:-python3.12}"
  VENV="${VENV:-$REPO/.venv-gpu}"
  PY="$VENV/bin/python"
fi
DEADLINE=$((SECONDS + BUDGET_S))
mkdir -p "$OUT" && : >"$OUT/stages.tsv"
cd "$REPO" || exit 1

say() { echo "[gpu_check $((SECONDS))s] $*" >&2; }

# run_stage NAME CAP_S CMD...: runs CMD for at most min(CAP_S, time left) (smoke: the time
# left), output to $OUT/NAME.log and stderr; records "NAME rc seconds limit" in stages.tsv.
run_stage() {
  local name="$1" cap="$2" left=$((DEADLINE - SECONDS)) start=$SECONDS rc
  shift 2
  ((SMOKE)) && cap=$left
  local limit=$((cap < left ? cap : left))
  if ((limit < 5)); then
    say "$name: skipped, the budget is spent"
    echo "$name 125 0 $limit" >>"$OUT/stages.tsv"
    return 125
  fi
  say "$name: up to ${limit}s: $*"
  # SIGTERM first (launch.train stops cleanly on it), SIGKILL 20 s later.
  timeout -k 20 "$limit" "$@" 2>&1 | tee "$OUT/$name.log" >&2
  rc=${PIPESTATUS[0]}
  echo "$name $rc $((SECONDS - start)) $limit" >>"$OUT/stages.tsv"
  ((rc == 0)) || say "$name: failed (exit $rc); log in $OUT/$name.log"
  return "$rc"
}

# uv fetches the wheels in parallel: pip fetches them one by one, 3.6 GB of them here.
UV_VERSION=0.13.9
install() {
  local stamp="$VENV/.requirements-gpu.sha256" want
  want="$(cat requirements.txt requirements-gpu.txt | sha256sum | cut -d' ' -f1)"
  [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] && { echo "$VENV is up to date"; return 0; }
  [ -x "$PY" ] || "$PYTHON" -m venv "$VENV" || return 1
  if "$PY" -m pip install --quiet "uv==$UV_VERSION"; then
    "$VENV/bin/uv" pip install --python "$PY" -r requirements-gpu.txt || return 1
  else
    echo "uv did not install; pip instead (slower)"
    "$PY" -m pip install --quiet --progress-bar off -r requirements-gpu.txt || return 1
  fi
  "$PY" -m pip check && echo "$want" >"$stamp"
}

# The wheels beside the site packages, nothing from an index. Ahead of site-packages on
# sys.path: where the site (or the smoke test's venv) has a package too, DIR's is used.
install_wheels() {
  rm -rf "$OUT/site"
  "$PY" -m pip install --no-index --no-deps --quiet --target "$OUT/site" "$WHEELS"/*.whl
}

# The learning run's command; it drives for at most LEARN_S seconds, fewer if the budget
# is short: 90 s of the stage go to start-up, compiling, the final evaluation, teardown.
learn_command() {
  local left=$((DEADLINE - SECONDS - 90)) gpus=1
  local drive=$((LEARN_S < left ? LEARN_S : left))
  ((drive < 5)) && drive=5
  ((SMOKE)) && gpus=0
  # A precaution: the driver's JAX sees the GPU too (its final evaluation runs there), and
  # XLA's default of 75% of the memory per process would leave a second process none.
  LEARN=(env XLA_PYTHON_CLIENT_PREALLOCATE=false "$PY" -m launch.train --agent="$LEARN_AGENT"
    --env="$LEARN_ENV" --preset=auto --launcher="$LAUNCHER" --num_actors="$LEARN_ACTORS"
    --learner_gpus="$gpus" --tf32 --max_wall_time_s="$drive" --eval_interval_s=30
    --checkpoint_interval_steps=0 --logdir="$OUT/learn" "${TRAIN_ARGS[@]}")
}

if ((!SMOKE)) && ! command -v nvidia-smi >/dev/null; then
  say "error: nvidia-smi not found: no NVIDIA driver on this host, so no GPU for JAX"
  exit 1
fi
if ((!SMOKE)); then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader \
    >"$OUT/gpus.csv" 2>&1
fi
if ((OFFLINE)); then
  export -f install_wheels && export PY WHEELS OUT
  run_stage install 120 bash -c install_wheels || say "error: the wheels in $WHEELS did not install"
  export PYTHONPATH="$OUT/site${PYTHONPATH:+:$PYTHONPATH}"
elif ((!SMOKE)); then
  export -f install && export VENV PY PYTHON UV_VERSION  # `timeout` runs programs, not functions
  run_stage install 300 bash -c install || say "error: the GPU set did not install"
fi
command -v "$PY" >/dev/null || say "error: no python at $PY"
require_gpu=--require_gpu
((SMOKE)) && require_gpu=
if run_stage devices 90 "$PY" bench/gpu_learner.py --check_devices $require_gpu; then
  run_stage learner 150 "$PY" bench/without.py envpool,ray,reverb,tensorflow \
    -m bench.gpu_learner "${BENCH_ARGS[@]}"
  run_stage actors 60 "$PY" bench/actor_throughput.py "${ACTOR_ARGS[@]}"
  learn_command && rm -rf "$OUT/learn"
  run_stage learn $((LEARN_S + 120)) "${LEARN[@]}"
else
  say "error: JAX does not compute on a GPU here; the benchmarks were not run"
fi

# The report: stage times and each stage's figures, one JSON line, last on stdout.
"$PYTHON" - "$OUT" "$SMOKE" "$OFFLINE" "$LEARN_AGENT" "$LEARN_ENV" "$SECONDS" <<'EOF'
import json, os, sys

out, smoke, offline = sys.argv[1], sys.argv[2] == "1", sys.argv[3] == "1"
agent, env_id, total_s = sys.argv[4:7]


def last_json(name):
    """The last JSON line of a stage's log, {} if it printed none."""
    try:
        with open(os.path.join(out, f"{name}.log")) as f:
            lines = [line for line in f if line.startswith("{")]
        return json.loads(lines[-1]) if lines else {}
    except (OSError, ValueError):
        return {}


stages = {}
with open(os.path.join(out, "stages.tsv")) as f:
    for line in f:
        name, rc, seconds, limit = line.split()
        stages[name] = {"rc": int(rc), "seconds": int(seconds), "limit_s": int(limit)}
wanted = ["devices", "learner", "actors", "learn"]
if offline or not smoke:
    wanted.insert(0, "install")
failed = [name for name in wanted if stages.get(name, {"rc": None})["rc"] != 0]
try:
    with open(os.path.join(out, "learn", "summary.json")) as f:
        summary = json.load(f)
except (OSError, ValueError):
    summary = {}
keys = ("stop_reason", "final_eval_return", "final_eval_episodes", "env_steps",
        "env_steps_per_s", "learner_steps", "learner_steps_per_s", "wall_time_s")
try:
    with open(os.path.join(out, "gpus.csv")) as f:
        gpus = [line.strip() for line in f if line.strip()]
except OSError:
    gpus = []
report = {
    "bench": "gpu_check",
    "mode": "cpu_smoke" if smoke else "gpu",
    "offline": offline,
    "status": "failed" if failed else "ok",
    "failed_stages": failed,
    "host": {"cpus": os.cpu_count(), "gpus": gpus},
    "devices": last_json("devices"),
    "learner": last_json("learner").get("results", []),
    "learner_complete": last_json("learner").get("complete", False),
    "actors": last_json("actors"),
    "learning_run": {"agent": agent, "env": env_id, **{k: summary.get(k) for k in keys}},
    "stages": stages,
    "total_s": int(total_s),
}
print(json.dumps(report))
sys.exit(1 if failed else 0)
EOF
