#!/usr/bin/env bash
# Every tier but e2e (and the vllm tier), as `make test-fast` and `make test` run them: three pytest processes
# side by side, each with a control plane or Mooncake processes of its own. They mostly wait (on API servers,
# masters, containers), so together they take little more than the longest alone:
#   - the operator's cluster tests (tests/cluster/test_operator_*.py), in the foreground;
#   - every other cluster test (charts, discovery, admission, observability);
#   - unit, proxy, store and images.
# Each run has its own temporary folder and JUnit file (for the timeline); all always run, the exit status is
# non-zero if any failed, and the output of the two beside is printed once they are done.
set -uo pipefail
cd "$(dirname "$0")/.."
pytest=${PYTEST:-.venv/bin/pytest}
timeline=(python3 tools/testenv/src/epd_testenv/timeline.py)
mkdir -p .run/timeline
pids=()
logs=()
trap 'kill "${pids[@]}" 2>/dev/null' EXIT

# beside NAME JUNIT PYTEST-ARGS...: a run in the background, its output kept for later.
beside() {
  local name=$1 junit=$2 log=.run/timeline/$2.log
  shift 2
  "${timeline[@]}" stage "pytest: $name (beside)" -- "$pytest" -p no:cacheprovider --basetemp=".run/pytest-$junit" \
    --junitxml=".run/timeline/junit-$junit.xml" "$@" > "$log" 2>&1 &
  pids+=($!)
  logs+=("$name|$log")
}

beside "unit, proxy, store, images" tiers -m "not e2e and not cluster"
beside "cluster: charts, discovery, admission, observability" cluster-rest -m cluster \
  --ignore-glob='tests/cluster/test_operator_*'
"${timeline[@]}" stage "pytest: cluster: the operator" -- "$pytest" -m cluster \
  --junitxml=.run/timeline/junit-cluster.xml tests/cluster/test_operator_*.py
rc=$?
for i in "${!pids[@]}"; do
  wait "${pids[$i]}" || rc=$?
  echo "---- pytest: ${logs[$i]%%|*} (it ran beside) ----"
  cat "${logs[$i]#*|}"
done
exit "$rc"
