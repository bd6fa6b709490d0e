#!/bin/sh
# run.sh - runs each libFuzzer target given for FUZZ_SECONDS, starting from
# its committed seed corpus tests/fuzz/corpus/<target>/ (read only; new
# inputs go to $FUZZ_BUILD/corpus/<target>/). Prints the executions per
# target; exits non-zero when any target finds a crash, leak or failed
# invariant (the input is saved as $FUZZ_BUILD/artifacts/<target>-crash-*).
set -u

FUZZ_BUILD=${FUZZ_BUILD:-build-fuzz}
FUZZ_SECONDS=${FUZZ_SECONDS:-30}
here=$(cd "$(dirname "$0")" && pwd)
failed=""
summary=""

for bin in "$@"; do
    name=$(basename "$bin")
    target=${name#fuzz_}
    work="$FUZZ_BUILD/corpus/$target"
    log="$FUZZ_BUILD/logs/$target.log"
    mkdir -p "$work" "$FUZZ_BUILD/artifacts" "$FUZZ_BUILD/logs"
    echo "fuzz: $target for ${FUZZ_SECONDS}s"
    ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1} \
    UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
        "$bin" -max_total_time="$FUZZ_SECONDS" -print_final_stats=1 -max_len=4096 \
        -timeout=10 -rss_limit_mb=2048 \
        -artifact_prefix="$FUZZ_BUILD/artifacts/$target-" \
        "$work" "$here/corpus/$target" >"$log" 2>&1
    rc=$?
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
    cov=$(grep -ao 'cov: [0-9]*' "$log" | tail -n 1)
    if [ "$rc" -ne 0 ]; then
        failed="$failed $target"
        echo "fuzz: $target FAILED (exit $rc), see $log:"
        grep -aE 'ERROR|invariant failed|SUMMARY|Test unit written' "$log" | head -n 20
        summary="$summary
  $target: FAILED after ${execs:-?} executions"
    else
        summary="$summary
  $target: ${execs:-?} executions, ${cov:-cov: ?}, no crash"
    fi
done

echo "fuzz summary (${FUZZ_SECONDS}s per target):$summary"
if [ -n "$failed" ]; then
    echo "fuzz: failures in:$failed"
    exit 1
fi
exit 0
