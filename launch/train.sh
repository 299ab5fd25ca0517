#!/usr/bin/env bash
# One command on a fresh machine: set up .venv, then run the default experiment
# (DQN on CartPole-v1, Ray launcher on this machine). Extra flags go to launch.train.
# DEEPMIND=1: the same on the DeepMind set (.venv-deepmind, Python 3.10: Reverb as the
# replay, under dm-launchpad: --launcher=launchpad, which later flags may override).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup_env.sh"
if [ "${DEEPMIND:-0}" = "1" ]; then
  exec python -m launch.train --launcher=launchpad "$@"
fi
exec python -m launch.train "$@"
