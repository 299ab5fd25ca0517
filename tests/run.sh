#!/usr/bin/env bash
# One command on a fresh machine: set up .venv, then run the test suite.
# Extra arguments go to pytest (e.g. `-m "not slow"` for the fast tests only;
# a -m of your own replaces the default, so `-m extended` runs the extended tests;
# `-n 0` runs them in this one process, in file order).
# 3 workers on 2 cores: most tests wait on Ray, heartbeats, timeouts and child
# processes rather than compute. tests/conftest.py says how tests are grouped.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../launch/setup_env.sh"
ruff check gorila_jax agents launch tests bench
exec python -m pytest -n 3 --dist loadfile -ra --durations=10 -m "not extended" "$@"
