#!/usr/bin/env bash
# One command on a fresh machine: set up .venv, then run the default experiment
# (DQN on CartPole-v1, Ray launcher on this machine). Extra flags go to launch.train.
# LAUNCHPAD=1: the same under dm-launchpad (.venv-launchpad, Python 3.10,
# --launcher=launchpad, which later flags may override).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup_env.sh"
if [ "${LAUNCHPAD:-0}" = "1" ]; then
  exec python -m launch.train --launcher=launchpad "$@"
fi
exec python -m launch.train "$@"
