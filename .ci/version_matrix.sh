#!/usr/bin/env bash
# The TensorFlow x Keras version matrix: one virtual environment per pair, the
# Keras-facing tests and the README's two quick starts in each, and a table of
# pair x test file (passed / failed). Exits non-zero if any pair fails anything.
#
# Usage: .ci/version_matrix.sh [--newest] [TF+KERAS ...]
#   TF+KERAS     a pair, e.g. 2.16.2+3.10.0 (default: the floor and a middle pair)
#   --newest     also the newest pair (2.21.0+3.15.1)
# Environment:
#   VERSION_MATRIX_CACHE    where the environments live (default ~/.cache/tf_adabatch_matrix);
#                           an environment is built once per pair and reused
#   VERSION_MATRIX_TIMEOUT  seconds per test file (default 1200)
#   VERSION_MATRIX_TABLE    also write the table (markdown) to this file
# pip's own cache (~/.cache/pip, or PIP_CACHE_DIR) serves every environment's wheels.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_PROGRESS_BAR=off TF_CPP_MIN_LOG_LEVEL=2

FLOOR=2.16.2+3.10.0
MIDDLE=2.18.1+3.11.3
NEWEST=2.21.0+3.15.1
CACHE=${VERSION_MATRIX_CACHE:-$HOME/.cache/tf_adabatch_matrix}
PER_FILE=${VERSION_MATRIX_TIMEOUT:-1200}

pairs=()
for arg in "$@"; do
  case "$arg" in
    --newest) newest=1 ;;
    *+*) pairs+=("$arg") ;;
    *) echo "version_matrix: a pair is TF+KERAS (e.g. $FLOOR), or --newest. Received: $arg" >&2; exit 2 ;;
  esac
done
[ ${#pairs[@]} -eq 0 ] && pairs=("$FLOOR" "$MIDDLE")
[ -n "${newest:-}" ] && pairs+=("$NEWEST")

# The Keras-facing tests (Keras's private pieces, the shims of its versions, fit, the
# custom loop) and the README's quick starts (run through tests/test_readme.py).
files=(
  tests/test_keras_private.py
  tests/test_keras_versions.py
  tests/test_fit.py
  tests/test_fit_keras.py
  tests/test_second_day.py
  tests/test_trainer.py
  tests/test_steps_per_execution.py
)
readme=(
  "tests/test_readme.py::test_custom_loop_quick_start_reaches_its_budget_with_a_grown_batch"
  "tests/test_readme.py::test_model_fit_quick_start_runs_two_epochs_of_50_steps_with_a_grown_batch"
)
columns=("${files[@]##*/}" "README quick starts")

declare -A result
failed_pairs=0
mkdir -p "$CACHE"
for pair in "${pairs[@]}"; do
  tf=${pair%%+*}
  keras=${pair##*+}
  env="$CACHE/tf$tf-keras$keras"
  log="$CACHE/tf$tf-keras$keras.log"
  echo "=== pair TF $tf + Keras $keras: environment $env (log $log)"
  start=$SECONDS
  ok=1
  if ! [ -x "$env/bin/python" ]; then
    python3 -m venv "$env" >"$log" 2>&1 || ok=0
  fi
  # The package again every run (editable, this checkout), the pair pinned exactly.
  if [ $ok = 1 ] && ! timeout 1800 "$env/bin/pip" install "tensorflow==$tf" "keras==$keras" \
      -e "$ROOT[test]" >>"$log" 2>&1; then
    ok=0
  fi
  if [ $ok = 1 ]; then
    got=$("$env/bin/python" -c "import tensorflow as tf, keras; print(tf.__version__ + '+' + keras.__version__)" 2>>"$log" | tail -1)
    if [ "$got" != "$pair" ]; then
      echo "    installed $got, not $pair" | tee -a "$log"
      ok=0
    fi
  fi
  echo "    environment ready in $((SECONDS - start)) s"
  if [ $ok = 0 ]; then
    echo "    install FAILED (see $log)"
    for c in "${columns[@]}"; do result["$pair|$c"]="not run (install failed)"; done
    failed_pairs=$((failed_pairs + 1))
    continue
  fi
  pair_failed=0
  for i in "${!columns[@]}"; do
    column=${columns[$i]}
    if [ "$i" -lt ${#files[@]} ]; then targets=("${files[$i]}"); else targets=("${readme[@]}"); fi
    t0=$SECONDS
    out=$(timeout "$PER_FILE" "$env/bin/python" -m pytest -p no:cacheprovider -o addopts="" \
      -n 0 -q "${targets[@]}" 2>&1)
    rc=$?
    summary=$(printf '%s\n' "$out" | grep -E '^[0-9]+ (passed|failed|skipped|error)|^=+ .*(passed|failed|error).* =+$' | tail -1 | sed -E 's/^=+ //; s/ =+$//; s/ in [0-9.]+s.*//')
    if [ $rc = 0 ]; then
      result["$pair|$column"]="passed ($summary)"
    else
      [ $rc = 124 ] && summary="timed out after $PER_FILE s"
      result["$pair|$column"]="FAILED (${summary:-exit $rc})"
      pair_failed=1
      printf '%s\n' "$out" | grep -E '^(FAILED|ERROR) ' | sed 's/^/    /'
    fi
    echo "    $column: ${result["$pair|$column"]} [$((SECONDS - t0)) s]"
    printf '%s\n' "$out" >>"$log"
  done
  failed_pairs=$((failed_pairs + pair_failed))
  echo "    pair done in $((SECONDS - start)) s"
done

# The table: one row per test file, one column per pair.
{
  printf '| test file |'
  for pair in "${pairs[@]}"; do printf ' TF %s + Keras %s |' "${pair%%+*}" "${pair##*+}"; done
  printf '\n|---|'
  for _ in "${pairs[@]}"; do printf -- '---|'; done
  printf '\n'
  for column in "${columns[@]}"; do
    printf '| %s |' "$column"
    for pair in "${pairs[@]}"; do printf ' %s |' "${result["$pair|$column"]}"; done
    printf '\n'
  done
} >"$CACHE/table.md"
echo
cat "$CACHE/table.md"
[ -n "${VERSION_MATRIX_TABLE:-}" ] && cp "$CACHE/table.md" "$VERSION_MATRIX_TABLE"
if [ $failed_pairs -gt 0 ]; then
  echo "version_matrix: $failed_pairs of ${#pairs[@]} pairs failed" >&2
  exit 1
fi
echo "version_matrix: all ${#pairs[@]} pairs passed"
