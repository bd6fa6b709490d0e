-- 013_producer_guard.sql - no producer past the guards through search_path, nor
-- with a job_id, created_at or replay count of its own.
--
-- 1. Every function of schema outbox runs with search_path pinned to
--    pg_catalog, pg_temp. Before, only ordering_key_busy() was: the insert
--    guard called has_table_privilege() and isfinite() and the header check
--    jsonb_path_exists() by the caller's search_path, so a producer owning a
--    schema of its own (normal for an application role) put functions of
--    those names first in its path and inserted succeeded, dead and running
--    rows, infinite leases and headers that are no object of strings. The
--    last statement below pins every function the schema holds; every later
--    migration that creates or replaces one carries the same SET clause (the
--    schema test checks all of them).
--
--    A pinned function is never inlined, and the CHECK job_headers_strings
--    called headers_are_strings() on every update of a row with headers
--    (each claim and complete): it now states the rule itself, with
--    qualified calls, which the constraint stores resolved.
--
-- 2. Producers do not choose job_id, created_at or replays, in either mode.
--    A job_id of -5 put a stream row in partition -1 (never published,
--    counted or cleaned up); a job_id ahead of the sequence made another
--    producer's next enqueue fail on the primary key and abort its business
--    transaction; a created_at a century ahead stopped the stream cleanup of
--    its partition and faked lag; a replay count changes the broker-side id
--    of a replayed row. From any role but the table's owner (and a role it
--    gave INSERT WITH GRANT OPTION) the insert guard refuses, with SQLSTATE
--    42501:
--      - a job_id that is not the value the identity sequence just gave the
--        row (currval() of the session). A session that has drawn no job id
--        at all gets PostgreSQL's 55000 "currval ... is not yet defined in
--        this session" for such a row instead, before the guard runs;
--      - a created_at other than now(), the start of the inserting
--        transaction (refused, not overridden: the row is not what the
--        producer wrote);
--      - replays other than 0.
--    currval() needs SELECT on the sequence, granted to PUBLIC below: it
--    shows the last job id given out and allows no nextval(). The owner
--    keeps writing any shape the CHECK constraints allow (restores, repairs,
--    the relay's and outboxctl's own writes are updates, which the guard does
--    not see).
--
--    Cost: the trigger's WHEN clause gains three comparisons and a privilege
--    test per inserted row, made by the executor; about 0.1 us a row, below
--    the noise of 300 000-row inserts here (1.1-1.3 s of backend CPU either
--    way).
--
-- 3. The keyed inbox takes every job id, 19 digits included (up to
--    9223372036854775807); it refused ids from 1 000 000 000 000 000 000 on.
--
-- Locks: ACCESS EXCLUSIVE on outbox.job for a moment, until the migration
-- commits: the header constraint is replaced and the trigger made again,
-- with no pass over the rows. The constraint stays NOT VALID: it checks
-- every row inserted or updated from now on, like the one it replaces, and
-- the finished rows with array header values that migration 003 kept on
-- purpose would fail a validation. Functions change in the catalog only.

-- ---- the header rule, stated in the constraint ------------------------------

CREATE OR REPLACE FUNCTION outbox.headers_are_strings(h jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_catalog.jsonb_typeof(h) = 'object'
           AND NOT pg_catalog.jsonb_path_exists(h, 'strict $.* ? (@.type() != "string")')
$$;

ALTER TABLE outbox.job
    DROP CONSTRAINT job_headers_strings,
    ADD CONSTRAINT job_headers_strings CHECK (
        headers = '{}'
        OR (pg_catalog.jsonb_typeof(headers) = 'object'
            AND NOT pg_catalog.jsonb_path_exists(headers, 'strict $.* ? (@.type() != "string")')))
    NOT VALID;

-- ---- the insert guard -------------------------------------------------------

CREATE OR REPLACE FUNCTION outbox.job_insert_guard() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NOT pg_catalog.isfinite(NEW.run_at) THEN
        RAISE EXCEPTION 'outbox run_at must be a finite time, got %', NEW.run_at
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT pg_catalog.isfinite(NEW.created_at) THEN
        RAISE EXCEPTION 'outbox created_at must be a finite time, got %', NEW.created_at
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- The owner holds every privilege WITH GRANT OPTION; a role the owner gave
    -- INSERT WITH GRANT OPTION administers the table and is trusted alike.
    IF pg_catalog.has_table_privilege(TG_RELID, 'INSERT WITH GRANT OPTION') THEN
        RETURN NEW;
    END IF;
    IF NEW.job_id <> pg_catalog.currval('outbox.job_job_id_seq'::regclass) THEN
        RAISE EXCEPTION 'outbox producers may not choose job_id (got %): it comes from the table''s identity sequence',
                        NEW.job_id
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'leave job_id out of the insert, without OVERRIDING SYSTEM VALUE';
    END IF;
    IF NEW.created_at <> pg_catalog.now() THEN
        RAISE EXCEPTION 'outbox producers may not choose created_at (got %): it is the time of the inserting transaction',
                        NEW.created_at
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'leave created_at out of the insert';
    END IF;
    IF NEW.replays <> 0 THEN
        RAISE EXCEPTION 'outbox producers may not set replays (got %): only a replay counts one',
                        NEW.replays
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'leave replays out of the insert';
    END IF;
    IF NEW.state = 'ready' AND NEW.worker_id IS NULL AND NEW.lease_until IS NULL
       AND NEW.attempts = 0 AND NEW.finished_at IS NULL AND NEW.stream_epoch IS NULL THEN
        -- only held is left: it stays when the key has an earlier unfinished
        -- row, else the row is ready at once (a held row without a key is
        -- refused by job_held_shape)
        IF NEW.held AND NEW.ordering_key IS NOT NULL
           AND NOT outbox.ordering_key_busy(NEW.queue, NEW.ordering_key, NEW.job_id) THEN
            NEW.held := false;
        END IF;
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'outbox producers may insert only ready rows: state ready, no worker, lease, attempts, finish time or stream place'
        USING ERRCODE = 'insufficient_privilege',
              HINT = 'use outbox.enqueue(), or insert the message columns only';
END
$$;

-- The owner's rows skip the job_id test before currval() runs: a restore or a
-- repair may insert its own ids in a session that has drawn none.
DROP TRIGGER job_insert_guard ON outbox.job;
CREATE TRIGGER job_insert_guard
    BEFORE INSERT ON outbox.job
    FOR EACH ROW
    WHEN (NOT pg_catalog.isfinite(NEW.run_at) OR NOT pg_catalog.isfinite(NEW.created_at)
          OR NEW.state <> 'ready' OR NEW.worker_id IS NOT NULL OR NEW.lease_until IS NOT NULL
          OR NEW.attempts <> 0 OR NEW.finished_at IS NOT NULL OR NEW.held
          OR NEW.stream_epoch IS NOT NULL OR NEW.created_at <> pg_catalog.now()
          OR NEW.replays <> 0
          OR (NOT pg_catalog.has_table_privilege('outbox.job'::regclass, 'INSERT WITH GRANT OPTION')
              AND NEW.job_id <> pg_catalog.currval('outbox.job_job_id_seq'::regclass)))
    EXECUTE FUNCTION outbox.job_insert_guard();

GRANT SELECT ON SEQUENCE outbox.job_job_id_seq TO PUBLIC;

-- ---- a stream queue's row ---------------------------------------------------

-- As in 012, with the partition rule of outbox.stream_partition_of() written
-- out: a call of a function with a pinned search_path is never inlined, and
-- cost each stream row about 10 us more (17 -> 29 us of backend CPU a row in a
-- 100 000-row INSERT ... SELECT here); written out, the pinned trigger costs
-- about 3 us a row more than before (17 -> 20 us).
CREATE OR REPLACE FUNCTION outbox.stream_row() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    NEW.state := 'stream';
    NEW.held := false;
    NEW.xid := pg_catalog.pg_current_xact_id();
    NEW.stream_partition := CASE WHEN NEW.ordering_key IS NULL
                                 THEN (NEW.job_id % TG_ARGV[0]::integer)::integer
                                 ELSE (pg_catalog.abs(pg_catalog.hashtext(NEW.ordering_key)::bigint)
                                       % TG_ARGV[0]::integer)::integer END;
    RETURN NEW;
END
$$;

-- ---- the keyed inbox: every job id ------------------------------------------

CREATE OR REPLACE FUNCTION outbox.inbox_accept(consumer text, message_id text, ordering_key text)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    job_id bigint;
BEGIN
    IF $3 IS NULL THEN
        RETURN outbox.inbox_accept($1, $2);
    END IF;
    -- the digits are tested before the value: a cast of other text would fail
    IF $2 ~ '^[0-9]{1,19}$' THEN
        IF $2::numeric <= 9223372036854775807 THEN
            job_id := $2::bigint;
        END IF;
    END IF;
    IF job_id IS NULL THEN
        RAISE EXCEPTION 'outbox inbox_accept with an ordering key needs a job id as message id, got %',
                        coalesce(to_json(left($2, 60))::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO outbox.inbox_key AS k (consumer, ordering_key, last_job_id)
    VALUES ($1, $3, job_id)
    ON CONFLICT ON CONSTRAINT inbox_key_pkey DO UPDATE
        SET last_job_id = excluded.last_job_id, accepted_at = excluded.accepted_at
        WHERE k.last_job_id < excluded.last_job_id;
    RETURN FOUND;
END
$$;

-- ---- every function: a pinned search_path -----------------------------------

DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN SELECT p.oid::regprocedure FROM pg_catalog.pg_proc AS p
             WHERE p.pronamespace = 'outbox'::regnamespace
               AND NOT coalesce('search_path=pg_catalog, pg_temp' = ANY (p.proconfig), false)
    LOOP
        EXECUTE pg_catalog.format('ALTER FUNCTION %s SET search_path = pg_catalog, pg_temp', f);
    END LOOP;
END
$$;
