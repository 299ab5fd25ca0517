#!/usr/bin/env bash
# Makes the wheel folder for `bench/gpu_check.sh --offline --wheels=DIR`, on a machine with
# internet and Python 3.12 (the GPU node's): bash bench/gpu_wheels.sh DIR
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: $0 DIR" >&2; exit 2; }
PYTHON="${PYTHON:-python3.12}"
exec "$PYTHON" "$(dirname "${BASH_SOURCE[0]}")/gpu_wheels.py" --out="$1"
