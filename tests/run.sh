#!/usr/bin/env bash
# One command on a fresh machine: set up .venv, then run the test suite.
# Extra arguments go to pytest (e.g. `-m "not slow"` for the fast tests only;
# a -m of your own replaces the default, so `-m extended` runs the extended tests;
# `-n 0` runs them in this one process, in file order).
# 3 workers on 2 cores: most tests wait on Ray, heartbeats, timeouts and child
# processes rather than compute. tests/conftest.py says how tests are grouped.
set -euo pipefail
# LAUNCHPAD=1: the Launchpad set (.venv-launchpad, Python 3.10) and the tests that
# prove it: the launchpad launcher, DQN learning under it, and the CLI's bad-input
# tests. The rest of the suite needs Ray, which is the default set's; lint runs there.
source "$(dirname "${BASH_SOURCE[0]}")/../launch/setup_env.sh"
if [ "${LAUNCHPAD:-0}" = "1" ]; then
  exec python -m pytest -n 2 --dist loadfile -ra --durations=5 -m "not extended" \
    tests/gorila_jax/test_launchpad_launcher.py tests/launch/test_train_cli.py "$@"
fi
ruff check gorila_jax agents launch tests bench
exec python -m pytest -n 3 --dist loadfile -ra --durations=10 -m "not extended" "$@"
