#!/usr/bin/env bash
# Creates the venv and installs its pinned requirements, once per version of the
# requirements file. Sourced by launch/train.sh and tests/run.sh.
#   default:     .venv, Python 3.12 or 3.13, requirements.txt (today's JAX, the native replay)
#   DEEPMIND=1:  .venv-deepmind, Python 3.10, requirements-deepmind.txt (dm-reverb 0.7.2 and
#                dm-launchpad 0.5.2 on TensorFlow 2.8; BUILD_NOTES.md, "The DeepMind set")
# PYTHON=/path/to/python picks the interpreter; it must be one of the versions above.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ -n "${LAUNCHPAD:-}" ]; then
  echo "error: LAUNCHPAD=1 is now DEEPMIND=1 (the DeepMind set: Reverb and Launchpad, Python 3.10)" >&2
  exit 2
fi
if [ "${DEEPMIND:-0}" = "1" ]; then
  WANT_VERSIONS="3.10"
  REQUIREMENTS="$REPO/requirements-deepmind.txt"
  VENV="${VENV:-$REPO/.venv-deepmind}"
  WHY="dm-launchpad 0.5.2 has wheels for Python 3.8-3.10 only"
else
  WANT_VERSIONS="3.12 3.13"
  REQUIREMENTS="$REPO/requirements.txt"
  VENV="${VENV:-$REPO/.venv}"
  WHY="JAX 0.11 and chex 0.1.92 need Python 3.11+, envpool 1.2.7 3.12+"
fi

version_of() { "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null; }
works() { [ -n "$1" ] && [[ " $WANT_VERSIONS " == *" $(version_of "$1") "* ]]; }
find_python() {
  if [ -n "${PYTHON:-}" ]; then
    works "$PYTHON" && echo "$PYTHON"
    return 0
  fi
  local version candidate
  for version in $WANT_VERSIONS; do
    # A pyenv shim is on the PATH but answers only when that version is selected,
    # so pyenv's own installs are looked at too.
    for candidate in "python$version" \
      "$(ls -d "$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")"/versions/$version.*/bin/python$version 2>/dev/null | sort -V | tail -1 || true)"; do
      if works "$candidate"; then
        echo "$candidate"
        return 0
      fi
    done
  done
}
FOUND="$(find_python)"
if [ -z "$FOUND" ]; then
  want="python${WANT_VERSIONS// / or python}"
  echo "error: no working $want found${PYTHON:+ (PYTHON=$PYTHON is $(version_of "$PYTHON" || echo 'not a Python'))}; gorila-jax needs it here ($WHY). Install it (e.g. 'pyenv install ${WANT_VERSIONS%% *}', or your distribution's python${WANT_VERSIONS%% *} and python${WANT_VERSIONS%% *}-venv), or set PYTHON=/path/to/$want" >&2
  exit 1
fi
# A venv made by another Python (the retired 3.11 set's .venv, say) is made anew.
if [ -x "$VENV/bin/python" ] && ! works "$VENV/bin/python"; then
  echo "setup: $VENV is Python $(version_of "$VENV/bin/python"), not ${WANT_VERSIONS// / or }; making it anew" >&2
  rm -rf "$VENV"
fi
if [ ! -x "$VENV/bin/python" ]; then
  "$FOUND" -m venv "$VENV"
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
