-- 011_stream_place.sql - rows a disabled stream hands to the claims keep their place.
--
-- A stream row's place is its partition's order: (xid, job_id) within one
-- stream of one queue. A broker that records how far each order was
-- published (Redis: one record per stream and partition, instead of one per
-- message) needs that place also for the rows outbox.stream_disable() turns
-- to 'ready': an owner may have published some of them just before, without
-- moving its cursor over them, and the claims must not publish them twice.
--
-- Such a row keeps stream_partition and records the stream it left in
-- stream_epoch: the microseconds since the epoch of outbox.stream's
-- created_at, unique to each time the queue was made a stream, so a stream
-- enabled again later never shares its order with the rows of an earlier one.
-- Every other row has stream_epoch NULL.
--
-- Locks: ADD COLUMN without a default changes the catalog only; the insert
-- guard's trigger is made again (below).

ALTER TABLE outbox.job ADD COLUMN stream_epoch bigint;

COMMENT ON COLUMN outbox.job.stream_epoch IS
    'a row a disabled stream turned ready: that stream (outbox.stream.created_at in microseconds)';
COMMENT ON COLUMN outbox.job.stream_partition IS
    'partition of a stream row, or of a row a disabled stream turned ready; NULL otherwise';

-- Makes a stream queue a row-state queue again: rows not yet published go
-- back to 'ready' for the claims, keeping their place (partition and the
-- stream's epoch), rows behind the cursor become 'succeeded' (kept for the
-- retention). A batch an owner published but did not record yet is found by
-- its place in a broker that records places (Redis); others publish it again
-- (a duplicate, never a loss). Returns false when the queue was no stream.
CREATE OR REPLACE FUNCTION outbox.stream_disable(queue text) RETURNS boolean
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    left_epoch bigint;
BEGIN
    SELECT (extract(epoch FROM s.created_at) * 1000000)::bigint INTO left_epoch
      FROM outbox.stream AS s WHERE s.queue = stream_disable.queue FOR UPDATE;
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
           stream_partition = CASE WHEN (j.xid, j.job_id) <= (c.cursor_xid, c.cursor_job_id)
                                   THEN NULL ELSE j.stream_partition END,
           stream_epoch = CASE WHEN (j.xid, j.job_id) <= (c.cursor_xid, c.cursor_job_id)
                               THEN NULL ELSE left_epoch END
      FROM outbox.stream_cursor AS c
     WHERE j.state = 'stream' AND j.queue = stream_disable.queue
       AND c.queue = j.queue AND c.partition = j.stream_partition;
    DELETE FROM outbox.stream AS s WHERE s.queue = stream_disable.queue;
    NOTIFY outbox_job;
    RETURN true;
END
$$;

-- A producer may not insert a row with a place of its own: the relay would
-- take it for a row a stream had published before and might not publish it.
-- The insert guard also fires on stream_epoch (its WHEN clause stays a
-- comparison the executor makes itself; DROP and CREATE TRIGGER hold a
-- SHARE ROW EXCLUSIVE lock on outbox.job for that instant).
CREATE OR REPLACE FUNCTION outbox.job_insert_guard() RETURNS trigger
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
    -- The owner holds every privilege WITH GRANT OPTION; a role the owner gave
    -- INSERT WITH GRANT OPTION administers the table and is trusted alike.
    IF has_table_privilege(TG_RELID, 'INSERT WITH GRANT OPTION') THEN
        RETURN NEW;
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

DROP TRIGGER job_insert_guard ON outbox.job;
CREATE TRIGGER job_insert_guard
    BEFORE INSERT ON outbox.job
    FOR EACH ROW
    WHEN (NOT isfinite(NEW.run_at) OR NOT isfinite(NEW.created_at) OR NEW.state <> 'ready'
          OR NEW.worker_id IS NOT NULL OR NEW.lease_until IS NOT NULL OR NEW.attempts <> 0
          OR NEW.finished_at IS NOT NULL OR NEW.held OR NEW.stream_epoch IS NOT NULL)
    EXECUTE FUNCTION outbox.job_insert_guard();
