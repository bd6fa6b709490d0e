-- 009_stream.sql - stream queues: published in commit-safe order through a cursor, no per-row write.
--
-- A queue can be a stream (outbox.stream_enable). Producers do not change:
-- enqueue() and enqueue_batch() insert as before, and a BEFORE INSERT
-- trigger, created per stream queue with the queue name in its WHEN
-- clause, turns the row into state 'stream' and gives it its partition.
-- Queues that are no stream never call the trigger's function: the WHEN
-- clause is a comparison the executor makes itself, and with no stream
-- enabled there is no trigger at all.
--
-- A 'stream' row is in none of the ready, lease, ordering or retention
-- indexes, so row-state claims never see it and cost nothing more; it is
-- in job_stream_idx only, which the stream read follows.
--
-- Every row records the transaction that inserted it (xid, xid8, from
-- pg_current_xact_id(), the top-level transaction also inside a
-- subtransaction). The owner of a (queue, partition) reads rows after its
-- cursor in (xid, job_id) order, and only rows of transactions older than
-- the oldest one still running, pg_snapshot_xmin(pg_current_snapshot()):
-- every such transaction has ended, so none can still commit a row behind
-- the cursor, whatever order the transactions committed in.
--
-- Ownership of a partition is a fenced lease on its outbox.stream_cursor
-- row, by the rule of outbox.job's rows: every write names owner and
-- generation and needs lease_until in the future.
--
-- Locks: ADD COLUMN without a default, then SET DEFAULT, changes the
-- catalog only (rows inserted before keep xid NULL); the constraint is
-- replaced NOT VALID and validated under SHARE UPDATE EXCLUSIVE; the index
-- is partial and empty at creation.

ALTER TABLE outbox.job ADD COLUMN xid xid8;
ALTER TABLE outbox.job ALTER COLUMN xid SET DEFAULT pg_current_xact_id();
ALTER TABLE outbox.job ADD COLUMN stream_partition integer;

COMMENT ON COLUMN outbox.job.xid IS 'the transaction that inserted the row (stream read order)';
COMMENT ON COLUMN outbox.job.stream_partition IS 'partition of a stream row; NULL outside streams';

-- 'stream': a row of a stream queue, published by its partition's cursor,
-- never claimed. A refused row leaves the stream for 'ready' (or 'dead').
ALTER TABLE outbox.job DROP CONSTRAINT job_state_valid;
ALTER TABLE outbox.job ADD CONSTRAINT job_state_valid
    CHECK (state IN ('ready', 'running', 'succeeded', 'dead', 'stream')) NOT VALID;
ALTER TABLE outbox.job VALIDATE CONSTRAINT job_state_valid;

-- The stream read: one partition's rows in (xid, job_id) order; cleanup of
-- rows behind the cursors follows it too.
CREATE INDEX job_stream_idx ON outbox.job (queue, stream_partition, xid, job_id)
    WHERE state = 'stream';

CREATE TABLE outbox.stream (
    queue      text PRIMARY KEY,
    partitions integer NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),

    CONSTRAINT stream_queue_name CHECK (length(queue) BETWEEN 1 AND 200 AND queue !~ '[^A-Za-z0-9._:-]'),
    CONSTRAINT stream_partitions_range CHECK (partitions BETWEEN 1 AND 256)
);

COMMENT ON TABLE outbox.stream IS 'queues published as streams, with their partition count';

-- One row per (queue, partition): who owns it and how far it was published.
CREATE TABLE outbox.stream_cursor (
    queue         text NOT NULL REFERENCES outbox.stream (queue) ON DELETE CASCADE,
    partition     integer NOT NULL,
    owner         text,
    generation    bigint NOT NULL DEFAULT 0,
    lease_until   timestamptz,
    cursor_xid    xid8 NOT NULL DEFAULT '0',
    cursor_job_id bigint NOT NULL DEFAULT 0,
    advanced_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (queue, partition),

    CONSTRAINT stream_cursor_owner_shape CHECK ((owner IS NULL) = (lease_until IS NULL))
);

COMMENT ON TABLE outbox.stream_cursor IS 'per stream partition: fenced owner lease and the published position';
COMMENT ON COLUMN outbox.stream_cursor.generation IS 'leases taken so far; every write names it';

-- The partition of a row: a hash of its ordering key, so one key stays in
-- one partition and keeps its order; rows without a key spread by job_id.
CREATE FUNCTION outbox.stream_partition_of(ordering_key text, job_id bigint, partitions integer)
RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN ordering_key IS NULL THEN (job_id % partitions)::integer
                ELSE (abs(hashtext(ordering_key)::bigint) % partitions)::integer END
$$;

-- The BEFORE INSERT trigger of a stream queue; its argument is the
-- partition count. The identity default has filled job_id already.
CREATE FUNCTION outbox.stream_row() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    NEW.state := 'stream';
    NEW.held := false;
    NEW.stream_partition := outbox.stream_partition_of(NEW.ordering_key, NEW.job_id,
                                                       TG_ARGV[0]::integer);
    RETURN NEW;
END
$$;

-- The name of a stream queue's trigger (queue names are not identifiers).
-- BEFORE INSERT triggers fire in name order: this one sorts after the
-- others of outbox.job (job_insert_guard, ...), so they see the row as
-- enqueue() made it, ready.
CREATE FUNCTION outbox.stream_trigger_name(queue text) RETURNS text
LANGUAGE sql IMMUTABLE
AS $$ SELECT 'z_job_stream_' || md5(queue) $$;

-- Makes queue a stream of partitions partitions. Rows inserted from the
-- commit on are stream rows; rows already ready stay with the claims.
-- Returns false when it was a stream already (with the same partitions;
-- another count is an error, since moving rows between partitions would
-- break the order of their keys). CREATE TRIGGER holds SHARE ROW EXCLUSIVE
-- on outbox.job until the commit: inserts wait that instant.
CREATE FUNCTION outbox.stream_enable(queue text, partitions integer DEFAULT 1) RETURNS boolean
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    existing integer;
BEGIN
    PERFORM outbox.check_queue_name(stream_enable.queue);
    IF stream_enable.partitions IS NULL OR stream_enable.partitions NOT BETWEEN 1 AND 256 THEN
        RAISE EXCEPTION 'stream partitions must be between 1 and 256, got %',
                        coalesce(stream_enable.partitions::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT s.partitions INTO existing FROM outbox.stream AS s WHERE s.queue = stream_enable.queue FOR UPDATE;
    IF existing IS NOT NULL THEN
        IF existing <> stream_enable.partitions THEN
            RAISE EXCEPTION 'queue % is a stream of % partitions already', stream_enable.queue, existing
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'disable the stream first to change its partitions';
        END IF;
        RETURN false;
    END IF;
    INSERT INTO outbox.stream (queue, partitions) VALUES (stream_enable.queue, stream_enable.partitions);
    INSERT INTO outbox.stream_cursor (queue, partition)
    SELECT stream_enable.queue, p FROM generate_series(0, stream_enable.partitions - 1) AS p;
    EXECUTE format('CREATE TRIGGER %I BEFORE INSERT ON outbox.job FOR EACH ROW'
                   ' WHEN (NEW.queue = %L) EXECUTE FUNCTION outbox.stream_row(%s)',
                   outbox.stream_trigger_name(stream_enable.queue), stream_enable.queue,
                   stream_enable.partitions);
    RETURN true;
END
$$;

-- Makes a stream queue a row-state queue again: rows not yet published go
-- back to 'ready' for the claims, rows behind the cursor become
-- 'succeeded' (kept for the retention). A batch an owner published but did
-- not record yet is published again by a claim: a duplicate, never a loss.
-- Returns false when the queue was no stream.
CREATE FUNCTION outbox.stream_disable(queue text) RETURNS boolean
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
BEGIN
    PERFORM 1 FROM outbox.stream AS s WHERE s.queue = stream_disable.queue FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    EXECUTE format('DROP TRIGGER IF EXISTS %I ON outbox.job',
                   outbox.stream_trigger_name(stream_disable.queue));
    -- the cursors are locked first: an owner's advance waits, then finds none
    PERFORM 1 FROM outbox.stream_cursor AS c WHERE c.queue = stream_disable.queue FOR UPDATE;
    UPDATE outbox.job AS j
       SET state = CASE WHEN (j.xid, j.job_id) <= (c.cursor_xid, c.cursor_job_id)
                        THEN 'succeeded' ELSE 'ready' END,
           finished_at = CASE WHEN (j.xid, j.job_id) <= (c.cursor_xid, c.cursor_job_id)
                              THEN now() END,
           stream_partition = NULL
      FROM outbox.stream_cursor AS c
     WHERE j.state = 'stream' AND j.queue = stream_disable.queue
       AND c.queue = j.queue AND c.partition = j.stream_partition;
    DELETE FROM outbox.stream AS s WHERE s.queue = stream_disable.queue;
    NOTIFY outbox_job;
    RETURN true;
END
$$;
