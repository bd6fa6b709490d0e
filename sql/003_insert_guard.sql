-- 003_insert_guard.sql - rows go in only in the shape enqueue() gives them.
--
-- 1. Producers insert ready rows only. A role that may INSERT into outbox.job
--    (outbox_producer, see sql/roles) could otherwise write a row that is
--    running under a made-up worker with a lease of a hundred years, or
--    succeeded, dead or held, and with an ordering key stop that key for
--    every producer. A BEFORE INSERT trigger refuses, with SQLSTATE 42501,
--    any other shape from a role that does not own the table: not ready, a
--    worker, a lease, attempts, a finish time, or a hold with no unfinished
--    row of its key before it (enqueue() holds a row exactly when there is
--    one). The owner (who runs migrations and repairs) may still write any
--    shape the CHECK constraints allow.
--
-- 2. run_at and created_at are finite, for everyone: an infinite time makes
--    every age ("now() - run_at") fail, which took down status, the backlog
--    sampling and with it the relay's connection. Refused with SQLSTATE
--    22023 by the same trigger, so enqueue() and direct inserts give the same
--    error. Updates are not checked: the relay and outboxctl only ever write
--    finite times, and every age the code computes reads any stored time
--    safely, also from rows written before this migration.
--
-- 3. Header values are strings, and an array is not one: the lax jsonpath
--    of 001 unwrapped arrays, so {"a": ["x"]} and {"a": []} passed and the
--    relay failed the row later. The check is now strict, for enqueue()
--    (22023) and for the table's CHECK job_headers_strings (23514).
--
-- Cost: the trigger's WHEN clause is a few comparisons evaluated in the
-- executor; the trigger function itself runs only for rows it refuses and for
-- held rows (an ordering key behind an unfinished row). No table rewrite:
-- CREATE TRIGGER takes a SHARE ROW EXCLUSIVE lock for a moment. The one scan
-- is the UPDATE below, which reads the unfinished rows with non-empty headers
-- under ordinary row locks.

-- Rows written before this migration with array header values: an unfinished
-- one would fail the stricter CHECK at its next claim and, with it, the whole
-- claim of its batch. They are dead now, saying why; finished rows stay as
-- they are (a retry of such a dead row is refused by the CHECK until its
-- headers are fixed).
UPDATE outbox.job
   SET state = 'dead', finished_at = clock_timestamp(), worker_id = NULL, lease_until = NULL,
       held = false,
       last_error = 'headers must be a JSON object of string values (array found by migration 003)'
 WHERE state IN ('ready', 'running') AND headers <> '{}'
   AND jsonb_path_exists(headers, 'strict $.* ? (@.type() != "string")');

CREATE OR REPLACE FUNCTION outbox.headers_are_strings(h jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT jsonb_typeof(h) = 'object' AND NOT jsonb_path_exists(h, 'strict $.* ? (@.type() != "string")')
$$;

-- True when the ordering key has a row before before_job_id that is unfinished,
-- or that finished since the calling transaction began (enqueue() may have
-- seen it unfinished a moment ago, and held its row behind it). Reads columns
-- a producer may not read, hence SECURITY DEFINER with a fixed search_path.
CREATE FUNCTION outbox.ordering_key_busy(queue text, ordering_key text, before_job_id bigint)
RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
    SELECT EXISTS (SELECT 1 FROM outbox.job AS e
                   WHERE e.queue = $1 AND e.ordering_key = $2 AND e.job_id < $3
                     AND (e.state IN ('ready', 'running') OR e.finished_at >= now()))
$$;

CREATE FUNCTION outbox.job_insert_guard() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    IF NOT isfinite(NEW.run_at) THEN
        RAISE EXCEPTION 'outbox run_at must be a finite time, got %', NEW.run_at
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT isfinite(NEW.created_at) THEN
        RAISE EXCEPTION 'outbox created_at must be a finite time, got %', NEW.created_at
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NEW.state = 'ready' AND NEW.worker_id IS NULL AND NEW.lease_until IS NULL
       AND NEW.attempts = 0 AND NEW.finished_at IS NULL THEN
        -- only held is left: right when the key has an earlier unfinished row
        IF NOT NEW.held OR (NEW.ordering_key IS NOT NULL
                            AND outbox.ordering_key_busy(NEW.queue, NEW.ordering_key, NEW.job_id)) THEN
            RETURN NEW;
        END IF;
    END IF;
    IF pg_has_role(current_user, (SELECT c.relowner FROM pg_catalog.pg_class AS c WHERE c.oid = TG_RELID),
                   'USAGE') THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'outbox producers may insert only ready rows: state ready, no worker, lease, attempts, finish time or hold'
        USING ERRCODE = 'insufficient_privilege',
              HINT = 'use outbox.enqueue(), or insert the message columns only';
END
$$;

CREATE TRIGGER job_insert_guard
    BEFORE INSERT ON outbox.job
    FOR EACH ROW
    WHEN (NOT isfinite(NEW.run_at) OR NOT isfinite(NEW.created_at) OR NEW.state <> 'ready'
          OR NEW.worker_id IS NOT NULL OR NEW.lease_until IS NOT NULL OR NEW.attempts <> 0
          OR NEW.finished_at IS NOT NULL OR NEW.held)
    EXECUTE FUNCTION outbox.job_insert_guard();
