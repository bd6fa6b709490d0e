-- 012_stream_xid.sql - only stream rows record the inserting transaction.
--
-- Migration 009 gave outbox.job.xid the default pg_current_xact_id(), so
-- every row recorded its transaction: 8 bytes more in the heap and the WAL
-- of each row, which row-state queues never read. The stream read needs it
-- for stream rows only, and every stream row passes through its queue's
-- trigger: the trigger now records it, and other rows keep xid NULL.
--
-- Every reader of xid reads stream rows only, or rows a disabled stream
-- handed to the claims (stream_epoch set), which were stream rows: the
-- stream read (job_stream_idx, WHERE state = 'stream'), stream_disable(),
-- the place a claim returns. The trigger also overrides an xid a producer
-- would write itself, so no stream row can claim a place behind a cursor.
--
-- Locks: DROP DEFAULT changes the catalog only, under ACCESS EXCLUSIVE for
-- a moment; CREATE OR REPLACE FUNCTION locks no table, and inserts that
-- start after the commit use the new body.

ALTER TABLE outbox.job ALTER COLUMN xid DROP DEFAULT;

COMMENT ON COLUMN outbox.job.xid IS
    'a stream row: the transaction that inserted it (stream read order); NULL for other rows';

-- A stream queue's row: state 'stream', its partition, and the top-level
-- transaction inserting it (also inside a subtransaction).
CREATE OR REPLACE FUNCTION outbox.stream_row() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    NEW.state := 'stream';
    NEW.held := false;
    NEW.xid := pg_current_xact_id();
    NEW.stream_partition := outbox.stream_partition_of(NEW.ordering_key, NEW.job_id,
                                                       TG_ARGV[0]::integer);
    RETURN NEW;
END
$$;
