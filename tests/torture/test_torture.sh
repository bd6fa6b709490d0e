#!/bin/sh
# test_torture.sh - the torture pass of `make test`: the whole matrix (every broker, both
# modes, two databases per destination) under two fixed seeds (the second's relays publishing
# structured CloudEvents), short histories, each with a history fault drawn from its seed
# (histories.py, on a PostgreSQL of the run's own); then
# the history faults' teeth (an older id form must be caught reusing ids across a cold copy);
# then the self-test, which must plant and report by name every kind of violation the
# checker knows, and exit non-zero. The mutation gate (test_mutants.sh) runs beside it.
# Runs against the suite's stack (OUTBOX_TEST_STACK_DIR); `make torture` is the long run.
set -u
here=$(dirname "$0")
PYTHON=/usr/bin/python3
export BIN=${OUTBOX_BIN:-${BIN:-bin}}
status=0

# the second seed's relays publish structured CloudEvents (the checker reads each event's data)
for run in 101:off 202:structured; do
    TORTURE_SEED=${run%:*} TORTURE_CLOUDEVENTS=${run#*:} TORTURE_SECONDS=${TORTURE_SECONDS:-12} \
        TORTURE_DRAIN=${TORTURE_DRAIN:-90} "$PYTHON" "$here/torture.py" || status=1
done

# The history faults' teeth: on an older id form (`database`: <database_id>:<epoch>:<job_id>),
# a cold copy started in place hands the rows after the split the ids of the lost branch's
# rows; a consumer deduplicating on the message id would drop them, and the torture must say
# so (promise=swallowed) and exit non-zero.
out=$(TORTURE_ID_FORM=database TORTURE_SEED=404 TORTURE_SECONDS=8 TORTURE_DRAIN=60 TORTURE_BROKERS=redis \
    TORTURE_MODES=row TORTURE_DATABASES=1 TORTURE_FAULTS=cold_copy "$PYTHON" "$here/torture.py" 2>&1)
teeth_status=$?
echo "$out" | grep -E '^(torture: seed|cell )'
if [ "$teeth_status" -eq 0 ] || ! echo "$out" | grep -q "^violation cell=redis/row promise=swallowed "; then
    echo "test_torture: with the id form 'database' a cold copy's reused ids were not reported (swallowed)" >&2
    status=1
fi

# The self-test: one violation of every kind the checker reports, planted; each must be named.
out=$(TORTURE_SELFTEST=1 TORTURE_SEED=303 TORTURE_SECONDS=6 TORTURE_BROKERS=redis TORTURE_MODES=row \
    TORTURE_DATABASES=1 TORTURE_FAULTS=none "$PYTHON" "$here/torture.py" 2>&1)
selftest_status=$?
echo "$out" | grep -v '^violation' | grep -E '^(selftest|torture: seed)'
if [ "$selftest_status" -eq 0 ]; then
    echo "test_torture: the self-test exited 0 with violations planted" >&2
    status=1
fi
kinds=$("$PYTHON" -c "import sys; sys.path.insert(0, '$here'); import checker; print(' '.join(checker.PROMISES))")
for kind in $kinds; do
    if ! echo "$out" | grep -q "^selftest redis/row planted .*\b$kind\b"; then
        echo "test_torture: the self-test did not plant a '$kind' violation" >&2
        status=1
    fi
    if ! echo "$out" | grep -q "^violation cell=redis/row promise=$kind "; then
        echo "test_torture: the self-test did not report the planted '$kind' violation" >&2
        status=1
    fi
done
if ! echo "$out" | grep -q "^selftest redis/row planted .*; all reported"; then
    echo "test_torture: the self-test did not report all it planted" >&2
    status=1
fi
exit $status
