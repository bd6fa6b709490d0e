#!/bin/bash
# test_mutants.sh - the mutation gate of `make test`: the torture must catch real defects.
#
# Each row of MUTANTS plants one defect in the relay (src/mutant.h: a block under
# #ifdef OUTBOX_MUTANTS, in the relay of `make mutants` alone, enabled by OUTBOX_MUTANT)
# and runs a short torture against it, aimed at the defect's window (its cell, its
# faults). The gate passes only when, for every mutant, its switch is still in the source,
# the relay says it fired, and the torture exits non-zero naming the promise the defect
# breaks. A mutant whose switch a refactor removed, or that no longer fires (in its run and
# in one more on the next seed: a busy host may run the faults before the rows they need are
# there), fails the gate loudly: a defect the torture is never shown is a defect it may
# have stopped catching.
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
# One torture against mutant $1 on cell $2, faults $3, for $4 s, seed $5, tag $6: its output,
# and its exit status.
torture_mutant() {
    OUTBOX_MUTANT=$1 TORTURE_RELAY=$relay TORTURE_SEED=$5 TORTURE_SECONDS=$4 \
        TORTURE_DRAIN=40 TORTURE_BROKERS=${2% *} TORTURE_MODES=${2#* } TORTURE_DATABASES=1 \
        TORTURE_RELAYS=url TORTURE_BATCH_SIZE=5 TORTURE_LEASES=5,5 TORTURE_FAULTS=$3 TORTURE_METRICS_WAIT=0 \
        TORTURE_TAG=$6 "$PYTHON" "$here/torture.py" 2>&1
}

# Why a run of mutant $1 (output $2, exit status $3) never tried the defect's window, if it
# did not: a busy host ran its faults before the relays held any row, or before the rows
# the defect needs were there.
untried() {
    if ! echo "$2" | grep -q "^torture: mutant $1 fired"; then
        echo "it never fired"
    elif [ "$3" -eq 0 ] && echo "$2" | grep -q "no row was in flight when a fault hit"; then
        echo "no row was in flight"
    fi
}

# One mutant's run; its verdict line (and on failure what the torture said) into $2. A run
# that never tried the defect's window is run once more on the next seed, and the verdict
# is the second run's: a mutant the torture reaches in neither fails the gate.
judge_mutant() {
    local name=$1 out_file=$2 cell=$3 faults=$4 seconds=$5 promise=$6 lane=$7 seed=$8 t0 out run_status
    local caught verdict=ok again="" why
    t0=$(date +%s)
    out=$(torture_mutant "$name" "$cell" "$faults" "$seconds" "$seed" "mutant$lane")
    run_status=$?
    why=$(untried "$name" "$out" "$run_status")
    if [ -n "$why" ] && ! echo "$out" | grep -q "^torture: mutant $name could not be planted"; then
        again=" (seed $seed: $why; again on seed $((seed + 1)))"
        out=$(torture_mutant "$name" "$cell" "$faults" "$seconds" "$((seed + 1))" "mutant$lane")
        run_status=$?
    fi
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
        printf 'mutant %-21s %-13s %4ss  caught: %s  %s%s\n' "$name" "$cell" $(($(date +%s) - t0)) \
            "${caught:-nothing}" "$verdict" "$again"
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
    head -n 1 "$results/$name" | grep -qE '  ok( \(.*\))?$' || status=1
done
echo "test_mutants: $(echo $names | wc -w) mutants in $(($(date +%s) - start)) s"
exit $status
