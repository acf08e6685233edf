#!/usr/bin/env bash
# Sets up the environment (see setup.sh; MXREC_TF=2.15|2.21) and runs the linter and the tests.
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=$(bash scripts/setup.sh | tail -n 1)
"$venv/bin/ruff" check .
"$venv/bin/python" -c "import tensorflow as tf; print('TensorFlow', tf.__version__)" 2>/dev/null
PYTHONPATH="$PWD" TF_CPP_MIN_LOG_LEVEL=2 "$venv/bin/python" -m pytest tests -q "$@"
