#!/usr/bin/env bash
# Creates the venv and installs its pinned requirements, once per version of the
# requirements file. Sourced by launch/train.sh and tests/run.sh.
#   default:      .venv, Python 3.11, requirements.txt
#   LAUNCHPAD=1:  .venv-launchpad, Python 3.10, requirements-launchpad.txt (dm-launchpad
#                 0.5.2 has no wheels past 3.10; BUILD_NOTES.md, "The Launchpad set")
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ "${LAUNCHPAD:-0}" = "1" ]; then
  WANT_VERSION=3.10
  REQUIREMENTS="$REPO/requirements-launchpad.txt"
  VENV="${VENV:-$REPO/.venv-launchpad}"
  WHY="dm-launchpad 0.5.2 has wheels for Python 3.8-3.10 only"
else
  WANT_VERSION=3.11
  REQUIREMENTS="$REPO/requirements.txt"
  VENV="${VENV:-$REPO/.venv}"
  WHY="dm-reverb has no wheels past 3.11"
fi

works() { [ -n "$1" ] && [ "$("$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" = "$WANT_VERSION" ]; }
PYTHON="${PYTHON:-python$WANT_VERSION}"
if ! works "$PYTHON"; then
  # A pyenv shim is on the PATH but answers only when that version is selected.
  found="$(ls -d "$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")"/versions/$WANT_VERSION.*/bin/python$WANT_VERSION 2>/dev/null | sort -V | tail -1 || true)"
  if works "$found"; then
    PYTHON="$found"
  else
    echo "error: no working python$WANT_VERSION found; gorila-jax needs Python $WANT_VERSION here ($WHY)." >&2
    echo "Install it (e.g. 'pyenv install $WANT_VERSION', or your distribution's python$WANT_VERSION and python$WANT_VERSION-venv), or set PYTHON=/path/to/python$WANT_VERSION" >&2
    exit 1
  fi
fi
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
stamp="$VENV/.requirements.sha256"
want="$(sha256sum "$REQUIREMENTS" | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  "$VENV/bin/python" -m pip install --quiet --upgrade pip
  "$VENV/bin/python" -m pip install --quiet -r "$REQUIREMENTS"
  echo "$want" > "$stamp"
fi
export PATH="$VENV/bin:$PATH"
cd "$REPO"
