#!/usr/bin/env bash
# Sets up the environment (see setup.sh) and trains the demo model; extra arguments go to the demo.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=$(bash scripts/setup.sh | tail -n 1)
PYTHONPATH="$PWD" TF_CPP_MIN_LOG_LEVEL=2 "$venv/bin/python" examples/demo.py "$@"
