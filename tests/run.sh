#!/usr/bin/env bash
# One command on a fresh machine: set up .venv, then run the test suite.
# Extra arguments go to pytest, in one session (e.g. `-m "not slow"` for the fast tests
# only; a -m of your own replaces the default, so `-m extended` runs the extended tests;
# `-n 0` runs them in this one process, in file order). Without them: the suite on 3
# xdist workers, then the `one_at_a_time` tests serially (tests/conftest.py).
# 3 workers on 2 cores: most tests wait on Ray, heartbeats, timeouts and child
# processes rather than compute.
set -euo pipefail
# DEEPMIND=1: the DeepMind set (.venv-deepmind, Python 3.10: Reverb, Launchpad, JAX 0.4.34)
# and the tests that prove it: the replay contract suite and the Reverb backend's own
# tests, the launchpad launcher, DQN learning under --replay=reverb with local and with
# launchpad, the learner's device and numeric tests on this JAX, and the CLI's bad-input
# tests. The rest of the suite needs Ray, which is the default set's; lint runs there.
source "$(dirname "${BASH_SOURCE[0]}")/../launch/setup_env.sh"
if [ "${DEEPMIND:-0}" = "1" ]; then
  python -m pytest -n 2 --dist loadfile -ra --durations=10 -m "not extended" \
    tests/gorila_jax/replay/test_replay_contract.py tests/gorila_jax/replay/test_replay.py \
    tests/gorila_jax/distributed/test_launchpad_launcher.py tests/launch/test_train_cli.py \
    tests/agents/dqn/test_learning.py tests/test_compat.py \
    "tests/test_end_to_end.py::test_dqn_solves_cartpole_and_holds_it_to_the_end_of_its_budget[reverb]" \
    "$@"
  # The Reverb cases of files whose other cases the default set runs.
  exec python -m pytest -n 2 --dist loadfile -ra --durations=5 -m "reverb and not extended" \
    tests/gorila_jax/replay/test_sharded_replay.py tests/gorila_jax/replay/test_tiered_replay.py \
    tests/gorila_jax/run/test_hard_inputs.py tests/gorila_jax/replay/test_writers.py \
    tests/gorila_jax/replay/test_compact_replay.py tests/gorila_jax/learning/test_fault_numeric.py "$@"
fi
ruff check gorila_jax agents launch tests bench
# A bound on each session (docs/testing.md): a session whose xdist worker lost its
# channel once waited for ever after its last test. Then SIGINT, so pytest still reports
# what ran and failed (exit code 124), and SIGKILL a minute later. TEST_TIMEOUT sets
# another bound (`-m extended` needs hours), 0 none.
bounded() { timeout --foreground --signal=INT --kill-after=60 "${TEST_TIMEOUT:-40m}" "$@"; }
if [ "$#" -gt 0 ]; then  # your own selection or options: one session, as you say
  bounded python -m pytest -n 3 --dist loadfile -ra --durations=10 -m "not extended" "$@"
  exit
fi
# The rest on 3 xdist workers, then the `one_at_a_time` tests (tests/conftest.py) one
# after another in a process of their own, without xdist's channel.
status=0
bounded python -m pytest -n 3 --dist loadfile -ra --durations=10 \
  -m "not extended and not one_at_a_time" || status=$?
bounded python -m pytest -n 0 -ra --durations=10 -m "one_at_a_time and not extended" || status=$?
exit $status
