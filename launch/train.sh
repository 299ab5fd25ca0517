#!/usr/bin/env bash
# One command on a fresh machine: set up .venv, then run the default experiment
# (DQN on CartPole-v1, Ray launcher on this machine). Extra flags go to launch.train.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup_env.sh"
exec python -m launch.train "$@"
