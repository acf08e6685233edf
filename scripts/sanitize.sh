#!/usr/bin/env bash
# Builds the engine stress test (tests/cc/engine_stress.cc, no TensorFlow) with the engine's
# sources twice, with the system g++: AddressSanitizer + UndefinedBehaviorSanitizer (any UB
# report aborts), then ThreadSanitizer. Runs each and fails on a failed check or any sanitizer
# report. Usage: bash scripts/sanitize.sh [asan|tsan ...]   (default: both)
#   MXREC_JOBS       parallel compile jobs (default 2)
#   MXREC_STRESS_SCALE  scales the test's batches (default 1)
# Objects and logs go to build/sanitize/<variant>/.
set -euo pipefail
cd "$(dirname "$0")/.."
cxx=${CXX:-g++}
jobs=${MXREC_JOBS:-2}
variants=("$@")
[ ${#variants[@]} -gt 0 ] || variants=(asan tsan)

common=(-std=c++17 -O1 -g -fno-omit-frame-pointer -pthread -Wall -Wextra -Werror
        -Wno-unused-parameter -D_GLIBCXX_ASSERTIONS -Icc_ops)
sources=(cc_ops/engine/*.cc tests/cc/engine_stress.cc)

build() {  # variant, flags...
  local variant=$1
  shift
  local out=build/sanitize/$variant
  mkdir -p "$out"
  local objects=() src obj
  rm -f "$out"/*.failed
  for src in "${sources[@]}"; do
    obj=$out/$(basename "${src%.cc}").o
    objects+=("$obj")
    # Rebuild when the source or any engine header is newer than the object.
    if [ -f "$obj" ] && [ -z "$(find "$src" cc_ops/engine -newer "$obj" -name '*.[ch]*' | head -n 1)" ] &&
       [ "$(cat "$out/flags" 2>/dev/null)" = "$*" ]; then
      continue
    fi
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
    { "$cxx" "${common[@]}" "$@" -c "$src" -o "$obj" || touch "$obj.failed"; } &
  done
  wait
  if compgen -G "$out/*.failed" > /dev/null; then
    echo "sanitize: compiling the $variant build failed" >&2
    return 1
  fi
  echo "$*" > "$out/flags"
  "$cxx" "${common[@]}" "$@" "${objects[@]}" -o "$out/engine_stress"
}

# A report that does not end the process (or ends it with status 0) still fails the run.
reports='ERROR: (Address|Leak)Sanitizer|runtime error:|WARNING: ThreadSanitizer'
reports+='|ThreadSanitizer: reported|SUMMARY: (Address|Thread|UndefinedBehavior)Sanitizer'

run() {  # variant
  local variant=$1 out=build/sanitize/$1 status=0 start end
  start=$(date +%s)
  "$out/engine_stress" > "$out/run.log" 2>&1 || status=$?
  end=$(date +%s)
  if [ "$status" != 0 ] || grep -Eq "$reports" "$out/run.log"; then
    echo "sanitize: $variant run FAILED (exit $status, $((end - start)) s); $out/run.log:" >&2
    grep -Eq "$reports" "$out/run.log" && grep -E -A40 "$reports" "$out/run.log" | head -n 120 >&2 ||
      tail -n 60 "$out/run.log" >&2
    return 1
  fi
  echo "sanitize: $variant passed in $((end - start)) s: $(grep '^engine_stress:' "$out/run.log")"
}

asan_options=detect_leaks=1:halt_on_error=1:abort_on_error=1:detect_stack_use_after_return=1
asan_options+=:check_initialization_order=1:strict_init_order=1
export ASAN_OPTIONS=${ASAN_OPTIONS:-$asan_options}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# Every race is reported, then the run exits 66.
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=0:exitcode=66:second_deadlock_stack=1:history_size=4}

status=0
for variant in "${variants[@]}"; do
  start=$(date +%s)
  case "$variant" in
    asan) build asan -fsanitize=address,undefined,float-cast-overflow -fno-sanitize-recover=all \
            -D_GLIBCXX_SANITIZE_VECTOR ;;
    tsan) build tsan -fsanitize=thread ;;
    *) echo "sanitize: unknown variant '$variant' (asan or tsan)" >&2; exit 2 ;;
  esac
  echo "sanitize: built $variant in $(($(date +%s) - start)) s"
  run "$variant" || status=1
done
exit "$status"
