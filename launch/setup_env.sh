#!/usr/bin/env bash
# Creates .venv (Python 3.11) and installs the pinned requirements, once per
# version of requirements.txt. Sourced by launch/train.sh and tests/run.sh.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3.11}"
VENV="${VENV:-$REPO/.venv}"

if ! command -v "$PYTHON" >/dev/null; then
  echo "error: $PYTHON not found; gorila-jax needs Python 3.11 (dm-reverb has no wheels past 3.11)" >&2
  exit 1
fi
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
stamp="$VENV/.requirements.sha256"
want="$(sha256sum "$REPO/requirements.txt" | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  "$VENV/bin/python" -m pip install --quiet --upgrade pip
  "$VENV/bin/python" -m pip install --quiet -r "$REPO/requirements.txt"
  echo "$want" > "$stamp"
fi
export PATH="$VENV/bin:$PATH"
cd "$REPO"
