#!/usr/bin/env bash
# Sets up the environment (see setup.sh) and trains the demo model; extra arguments go to the demo.
# --streaming runs the streaming demo instead (examples/streaming_demo.py: MovieLens-100k daily
# partitions, the streaming trainer with delivery, a predictor, a replay client).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=$(bash scripts/setup.sh | tail -n 1)
if [ "${1:-}" = "--streaming" ]; then
  shift
  PYTHONPATH="$PWD" TF_CPP_MIN_LOG_LEVEL=2 exec "$venv/bin/python" examples/streaming_demo.py "$@"
fi
PYTHONPATH="$PWD" TF_CPP_MIN_LOG_LEVEL=2 "$venv/bin/python" examples/demo.py "$@"
