#!/usr/bin/env bash
# Sets up the environment (see setup.sh; MXREC_TF=2.15|2.21) and runs the linter and the tests.
# Extra arguments go to pytest.
# MXREC_TEST_JOBS=N (N > 1; CI uses 2) runs the tests not marked `serial` on N pytest-xdist
# workers, then the `serial` ones (they start ranks of their own) one at a time; a -m
# expression among the arguments applies to both runs. MXREC_TEST_PART=parallel runs only the
# first of the two, MXREC_TEST_PART=serial only the second (.ci/run does other work beside it).
set -euo pipefail
cd "$(dirname "$0")/.."
part=${MXREC_TEST_PART:-all}
case "$part" in
  all|parallel|serial) ;;
  *) echo "scripts/test.sh: MXREC_TEST_PART=$part is not all, parallel or serial" >&2; exit 2 ;;
esac
venv=$(bash scripts/setup.sh | tail -n 1)
if [ "$part" != serial ]; then
  "$venv/bin/ruff" check .
  "$venv/bin/python" -c "import tensorflow as tf; print('TensorFlow', tf.__version__)" 2>/dev/null
fi
pytest=(env PYTHONPATH="$PWD" TF_CPP_MIN_LOG_LEVEL=2 "$venv/bin/python" -m pytest tests -q)
jobs=${MXREC_TEST_JOBS:-1}
if ! [[ "$jobs" =~ ^[0-9]+$ ]] || [ "$jobs" -lt 1 ]; then
  echo "scripts/test.sh: MXREC_TEST_JOBS=$jobs is not a positive number of workers" >&2
  exit 2
fi
if [ "$jobs" = 1 ] && [ "$part" = all ]; then
  exec "${pytest[@]}" "$@"
fi
# Split a -m EXPR (or -mEXPR, --markexpr[=]EXPR) out of the arguments.
marks="" rest=()
while [ $# -gt 0 ]; do
  case "$1" in
    -m|--markexpr)
      [ $# -ge 2 ] || { echo "scripts/test.sh: $1 needs a mark expression" >&2; exit 2; }
      marks=$2; shift 2 ;;
    --markexpr=*) marks=${1#--markexpr=}; shift ;;
    -m*) marks=${1#-m}; shift ;;
    *) rest+=("$1"); shift ;;
  esac
done
run() {  # pytest on the tests of mark expression $1 (and the caller's), more arguments after it
  local expr=$1 code=0
  shift
  [ -z "$marks" ] || expr="($marks) and $expr"
  "${pytest[@]}" -m "$expr" "$@" ${rest[@]+"${rest[@]}"} || code=$?
  # pytest's exit status 5: no test selected (every test of the selection is serial, or none is).
  [ "$code" = 5 ] && return 0
  return "$code"
}
parallel=(-n "$jobs")
[ "$jobs" -gt 1 ] || parallel=()
status=0
[ "$part" = serial ] || run "not serial" ${parallel[@]+"${parallel[@]}"} || status=$?
[ "$part" = parallel ] || run serial || status=$?
exit "$status"
