#!/bin/bash
# test_mutants.sh - the mutation gate of `make test`: the torture must catch real defects.
#
# Each row of MUTANTS plants one defect in the relay (src/mutant.h: a block under
# #ifdef OUTBOX_MUTANTS, in the relay of `make mutants` alone, enabled by OUTBOX_MUTANT)
# and runs a short torture against it, aimed at the defect's window (its cell, its
# faults). The gate passes only when, for every mutant, its switch is still in the source,
# the relay says it fired, and the torture exits non-zero naming the promise the defect
# breaks. A mutant whose switch a refactor removed, or that no longer fires, fails the
# gate loudly: a defect the torture is never shown is a defect it may have stopped catching.
#
# Runs against the suite's stack (OUTBOX_TEST_STACK_DIR); MUTANT_RELAY (default
# build-mutants/bin/outbox-relay) is the relay with the planted defects; MUTANTS_ONLY
# (names, comma-separated) runs some rows only.
set -u
here=$(cd "$(dirname "$0")" && pwd)
source_dir=$(cd "$here/../.." && pwd)
PYTHON=/usr/bin/python3
export BIN=${OUTBOX_BIN:-${BIN:-$source_dir/bin}}
relay=${MUTANT_RELAY:-$source_dir/build-mutants/bin/outbox-relay}

# name | brokers/modes | faults | seconds | the promise that must be named [| seed, 4646 if none]
MUTANTS="
mark_without_publish | redis row    | none              | 6 | unpublished
reverse_batch        | amqp stream  | broker_stall_kill | 6 | order
stream_cursor_skip   | redis stream | broker_stall_kill | 6 | lost
redis_dedup_ignored  | redis row    | mark_stall_kill   | 6 | duplicate
unfenced_mark        | redis row    | mark_stall_long   | 6 | fence
claim_ignores_key    | redis row    | broker_stall_kill | 6 | order
reaper_succeeded     | redis row    | mark_stall_kill   | 6 | reap
dead_republished     | redis row    | relay_kill        | 6 | refused
stream_record_trusted | redis stream | async_crash       | 8 | lost
claims_record_trusted | redis stream | async_crash_disable | 8 | lost | 2
"

if [ ! -x "$relay" ]; then
    echo "test_mutants: no mutant relay at $relay (make mutants)" >&2
    exit 1
fi
# One mutant's run; its verdict line (and on failure what the torture said) into $2.
judge_mutant() {
    local name=$1 out_file=$2 cell=$3 faults=$4 seconds=$5 promise=$6 lane=$7 seed=$8 t0 out run_status
    local caught verdict=ok
    t0=$(date +%s)
    out=$(OUTBOX_MUTANT=$name TORTURE_RELAY=$relay TORTURE_SEED=$seed TORTURE_SECONDS=$seconds \
        TORTURE_DRAIN=40 TORTURE_BROKERS=${cell% *} TORTURE_MODES=${cell#* } TORTURE_DATABASES=1 \
        TORTURE_RELAYS=url TORTURE_BATCH_SIZE=5 TORTURE_LEASES=5,5 TORTURE_FAULTS=$faults TORTURE_METRICS_WAIT=0 \
        TORTURE_TAG=mutant$lane "$PYTHON" "$here/torture.py" 2>&1)
    run_status=$?
    caught=$(echo "$out" | sed -n 's/^violation cell=[^ ]* promise=\([a-z]*\) .*/\1/p' | sort | uniq -c |
        awk '{ printf "%s%s=%s", sep, $2, $1; sep = "," }')
    if echo "$out" | grep -q "^torture: mutant $name could not be planted"; then
        verdict="FAILED (its fragment is gone from the statement)"
    elif ! echo "$out" | grep -q "^torture: mutant $name fired"; then
        verdict="FAILED (it never fired)"
    elif [ "$run_status" -eq 0 ]; then
        verdict="FAILED (the torture passed)"
    elif ! echo "$out" | grep -q "^violation cell=[^ ]* promise=$promise "; then
        verdict="FAILED (no '$promise' violation)"
    fi
    {
        printf 'mutant %-21s %-13s %4ss  caught: %s  %s\n' "$name" "$cell" $(($(date +%s) - t0)) \
            "${caught:-nothing}" "$verdict"
        [ "$verdict" = ok ] || echo "$out" | grep -E '^(torture|cell|paths|violation)' | head -n 30 | sed 's/^/    /'
    } >"$out_file"
}

status=0
start=$(date +%s)
results=$(mktemp -d)
trap 'rm -rf "$results"' EXIT
lane=0
names=""
while IFS='|' read -r name cell faults seconds promise seed; do
    name=$(echo $name) cell=$(echo $cell) faults=$(echo $faults) seconds=$(echo $seconds)
    promise=$(echo $promise) seed=$(echo ${seed:-4646})
    [ -n "$name" ] || continue
    case ",${MUTANTS_ONLY:-$name}," in *",$name,"*) ;; *) continue ;; esac
    names="$names $name"
    if ! grep -rqF "\"$name\"" "$source_dir/src" "$source_dir/relay"; then
        echo "mutant $name: FAILED (its switch is gone from src/ and relay/)" >"$results/$name"
        continue
    fi
    # two at a time, each on databases and broker objects of its own (TORTURE_TAG)
    while [ "$(jobs -rp | wc -l)" -ge 2 ]; do
        wait -n
    done
    lane=$((lane + 1))
    judge_mutant "$name" "$results/$name" "$cell" "$faults" "$seconds" "$promise" "$lane" "$seed" &
done <<<"$MUTANTS"
wait
for name in $names; do
    cat "$results/$name"
    head -n 1 "$results/$name" | grep -q '  ok$' || status=1
done
echo "test_mutants: $(echo $names | wc -w) mutants in $(($(date +%s) - start)) s"
exit $status
