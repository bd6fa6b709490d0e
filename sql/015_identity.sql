-- 015_identity.sql - a database identity and a history epoch, so that message
-- ids are unique across databases and across failovers.
--
-- job_id is unique within one database, along one history of it. Two
-- databases publishing into one destination both number from 1, and a
-- standby promoted while it lagged hands out again the job ids its old
-- primary had published; a broker or a consumer deduplicating on the bare
-- job id then drops the other database's rows, or the rows committed after
-- the failover. So a relay publishes each row under a message id
--
--     <database_id>:<epoch>:<job_id>         (a replayed row: ...<job_id>.r<n>)
--
-- outbox.identity holds the database's single row:
--   database_id        chosen at migrate time (12 random hex digits), kept by
--                      pg_dump / pg_restore with the table, changed only by
--                      outbox.identity_set() (`outboxctl identity set`): a
--                      copy that publishes beside its original needs its own
--   id_form            'database': message ids as above; 'job': the bare job
--                      id of earlier releases, kept by a database migrated
--                      with rows in it until an operator switches
--   epoch              the history: bumped by outbox.identity_observe() when
--                      the cluster (system identifier) or its timeline
--                      changed since it was recorded: a promotion, a
--                      point-in-time recovery, a restore into a new cluster
--   system_identifier, timeline   the history the epoch was recorded on
--
-- Within one cluster's line of timelines the epoch moves by as much as the
-- timeline did (epoch - timeline stays the same), so two standbys promoted one
-- after the other, the second before it received the first one's epoch, still
-- get two epochs (their timelines differ); a new cluster adds 1. Epochs only
-- grow: the keyed inbox orders (epoch, job_id).
--
-- Locks: a new table and functions; outbox.inbox_key gains two columns with
-- constant defaults (catalog only) and a new primary key (an index build on
-- the consumers' table, ACCESS EXCLUSIVE for that time).

CREATE TABLE outbox.identity (
    only_row          boolean PRIMARY KEY DEFAULT true,
    database_id       text NOT NULL,
    id_form           text NOT NULL,
    epoch             integer NOT NULL DEFAULT 1,
    system_identifier bigint,
    timeline          integer,
    changed_at        timestamptz NOT NULL DEFAULT now(),

    CONSTRAINT identity_one_row CHECK (only_row),
    CONSTRAINT identity_database_id_shape CHECK (database_id ~ '^[A-Za-z0-9_-]{1,40}$'),
    CONSTRAINT identity_id_form CHECK (id_form IN ('database', 'job')),
    CONSTRAINT identity_epoch_positive CHECK (epoch > 0)
);

COMMENT ON TABLE outbox.identity IS
    'this database''s identity and history epoch: message ids are <database_id>:<epoch>:<job_id>';

-- The timeline WAL is written on now (the first 8 hex digits of the current
-- WAL file's name): pg_control_checkpoint() shows the new one only after
-- the first checkpoint that follows a promotion. Fails on a standby.
CREATE FUNCTION outbox.current_timeline() RETURNS integer
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT ('x' || substr(pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn()), 1, 8))::bit(32)::integer
$$;

-- A database that never handed out a job id takes the new form; one with a
-- history keeps the bare job id until an operator switches (no consumer
-- sees its ids change under it).
DO $$
DECLARE
    used boolean;
BEGIN
    EXECUTE format('SELECT is_called FROM %s', pg_catalog.pg_get_serial_sequence('outbox.job', 'job_id'))
       INTO used;
    INSERT INTO outbox.identity (database_id, id_form, system_identifier, timeline)
    SELECT left(replace(pg_catalog.gen_random_uuid()::text, '-', ''), 12),
           CASE WHEN used OR EXISTS (SELECT 1 FROM outbox.job) THEN 'job' ELSE 'database' END,
           (SELECT s.system_identifier FROM pg_catalog.pg_control_system() AS s),
           outbox.current_timeline();
END
$$;

-- What a relay publishes under, on its connection: the identity, with the
-- epoch bumped first when this cluster or its timeline is not the one
-- recorded. Concurrent callers bump once: the second waits for the first's
-- row lock, then finds the history recorded. SECURITY DEFINER: the relay's
-- role reads the table but does not write it.
CREATE FUNCTION outbox.identity_observe(OUT database_id text, OUT id_form text, OUT epoch integer)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    cluster bigint := (SELECT s.system_identifier FROM pg_catalog.pg_control_system() AS s);
    line integer := outbox.current_timeline();
BEGIN
    UPDATE outbox.identity AS i
       SET epoch = CASE WHEN i.system_identifier = cluster AND line > i.timeline
                        THEN i.epoch + (line - i.timeline) ELSE i.epoch + 1 END,
           system_identifier = cluster, timeline = line, changed_at = now()
     WHERE i.system_identifier IS DISTINCT FROM cluster OR i.timeline IS DISTINCT FROM line;
    SELECT i.database_id, i.id_form, i.epoch INTO database_id, id_form, epoch FROM outbox.identity AS i;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'outbox.identity has no row: run outboxctl migrate'
            USING ERRCODE = 'undefined_object';
    END IF;
END
$$;

-- Sets the database id and/or the id form (NULL keeps each), for `outboxctl
-- identity set`: a copy of a database (CREATE DATABASE ... TEMPLATE, a
-- restore beside its original) that publishes into the same destinations
-- needs an id of its own; a database of an earlier release switches to the
-- new form once its consumers deduplicate on it. Owner only.
CREATE FUNCTION outbox.identity_set(new_database_id text, new_id_form text DEFAULT NULL)
RETURNS TABLE (database_id text, id_form text, epoch integer)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF new_database_id IS NOT NULL AND new_database_id !~ '^[A-Za-z0-9_-]{1,40}$' THEN
        RAISE EXCEPTION 'outbox database id must be 1-40 characters of [A-Za-z0-9_-], got %',
                        to_json(left(new_database_id, 60))::text
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF new_id_form IS NOT NULL AND new_id_form NOT IN ('database', 'job') THEN
        RAISE EXCEPTION 'outbox id form must be database or job, got %',
                        to_json(left(new_id_form, 60))::text
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY
    UPDATE outbox.identity AS i
       SET database_id = coalesce(new_database_id, i.database_id),
           id_form = coalesce(new_id_form, i.id_form), changed_at = now()
    RETURNING i.database_id, i.id_form, i.epoch;
END
$$;
REVOKE ALL ON FUNCTION outbox.identity_set(text, text) FROM PUBLIC;

-- ---- the inbox takes every message id form ----------------------------------

-- The keyed inbox orders a key's messages per database: (epoch, job_id) rises
-- along the database's history. A message id of the 'job' form is database
-- '' and epoch 0.
ALTER TABLE outbox.inbox_key ADD COLUMN database_id text NOT NULL DEFAULT '';
ALTER TABLE outbox.inbox_key ADD COLUMN last_epoch integer NOT NULL DEFAULT 0;
ALTER TABLE outbox.inbox_key DROP CONSTRAINT inbox_key_pkey;
ALTER TABLE outbox.inbox_key ADD CONSTRAINT inbox_key_pkey PRIMARY KEY (consumer, database_id, ordering_key);

COMMENT ON TABLE outbox.inbox_key IS
    'the last (epoch, job id) each consumer applied per database and ordering key, for consumers that keep key order';

-- True when consumer may apply message_id of ordering_key: its (epoch, job
-- id) is above the last one the consumer accepted for that key of that
-- database. False for a repeat and for a message older than one already
-- applied (a late publish of a stale batch). A replay (".r<n>") is an
-- operator's request to apply a row again: it is accepted once, by its id,
-- through the plain inbox, whatever the key's order. A NULL ordering_key is
-- the plain inbox_accept(consumer, message_id).
CREATE OR REPLACE FUNCTION outbox.inbox_accept(consumer text, message_id text, ordering_key text)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    part text[];
    database text;
    history integer;
    job bigint;
BEGIN
    IF $3 IS NULL THEN
        RETURN outbox.inbox_accept($1, $2);
    END IF;
    part := pg_catalog.regexp_match($2, '^(?:([A-Za-z0-9_-]{1,40}):([0-9]{1,9}):)?([0-9]{1,19})(\.r[0-9]{1,9})?$');
    IF part IS NULL OR part[3]::numeric > 9223372036854775807 THEN
        RAISE EXCEPTION 'outbox inbox_accept with an ordering key needs a message id of the relay (<database>:<epoch>:<job_id>, or a job id), got %',
                        coalesce(to_json(left($2, 60))::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF part[4] IS NOT NULL THEN
        RETURN outbox.inbox_accept($1, $2);
    END IF;
    database := coalesce(part[1], '');
    history := coalesce(part[2]::integer, 0);
    job := part[3]::bigint;
    INSERT INTO outbox.inbox_key AS k (consumer, database_id, ordering_key, last_epoch, last_job_id)
    VALUES ($1, database, $3, history, job)
    ON CONFLICT ON CONSTRAINT inbox_key_pkey DO UPDATE
        SET last_epoch = excluded.last_epoch, last_job_id = excluded.last_job_id,
            accepted_at = excluded.accepted_at
        WHERE (k.last_epoch, k.last_job_id) < (excluded.last_epoch, excluded.last_job_id);
    RETURN FOUND;
END
$$;

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'outbox_relay') THEN
        GRANT SELECT ON outbox.identity TO outbox_relay;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'outbox_reader') THEN
        GRANT SELECT ON outbox.identity TO outbox_reader;
    END IF;
END
$$;

-- ---- stream cursors know their history -------------------------------------

-- The history epoch a cursor's place belongs to. xid8 values compare only
-- along one history of one cluster: after a restore into another cluster
-- (transaction ids start again low) or a standby's promotion, a place of the
-- old history says nothing about rows of the new one. A relay that finds a
-- cursor of another epoch than its connection's, or a cursor ahead of the
-- transaction ids handed out now, rebases the partition
-- (outbox.stream_rebase) before it reads.
CREATE FUNCTION outbox.identity_epoch() RETURNS integer
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT i.epoch FROM outbox.identity AS i
$$;

ALTER TABLE outbox.stream_cursor ADD COLUMN history_epoch integer;
UPDATE outbox.stream_cursor SET history_epoch = outbox.identity_epoch();
ALTER TABLE outbox.stream_cursor ALTER COLUMN history_epoch SET DEFAULT outbox.identity_epoch();
ALTER TABLE outbox.stream_cursor ALTER COLUMN history_epoch SET NOT NULL;

COMMENT ON COLUMN outbox.stream_cursor.history_epoch IS
    'the history (outbox.identity.epoch) the cursor''s place belongs to';

-- Rebases a partition the caller holds (owner, generation, live lease) onto
-- history epoch new_epoch, when its cursor belongs to another one or is
-- ahead of the transaction ids handed out now. Nothing is lost, at the
-- price of publishing again rows that may have been published:
--   * rows certainly published (at or before the cursor, with a job id not
--     above the cursor's: every row committed in the new history has a
--     higher job id than every row it inherited, since the sequence moved
--     before them) get xid 1;
--   * every other row of the partition - waiting in the old history, or
--     committed in the new one, whatever its xid - gets xid 2, so they go
--     out in job id order, the inherited ones first;
--   * the cursor becomes (1, the highest job id): behind every row of xid 2
--     and every xid the new history hands out (3 and above).
-- Returns the new cursor, no row when the lease is not held. A cursor of a
-- later epoch than new_epoch is refused (SQLSTATE 55000): the identity was
-- set back by hand or restored apart from the cursors, and which rows were
-- published cannot be told.
CREATE FUNCTION outbox.stream_rebase(owner text, queue text, stream_partition integer,
                                     generation bigint, new_epoch integer)
RETURNS TABLE (cursor_xid text, cursor_job_id bigint, history_epoch integer)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    c record;
BEGIN
    SELECT s.cursor_xid, s.cursor_job_id, s.history_epoch INTO c
      FROM outbox.stream_cursor AS s
     WHERE s.queue = stream_rebase.queue AND s.partition = stream_rebase.stream_partition
       AND s.owner = stream_rebase.owner AND s.generation = stream_rebase.generation
       AND s.lease_until > clock_timestamp()
       FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF c.history_epoch > new_epoch THEN
        RAISE EXCEPTION 'outbox stream cursor of queue % partition % belongs to history epoch %, after this database''s %: which rows were published cannot be told',
                        to_json(stream_rebase.queue)::text, stream_rebase.stream_partition,
                        c.history_epoch, new_epoch
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'restore outbox.identity with the cursors, or set the cursors'' history_epoch to the identity''s epoch to publish every row again';
    END IF;
    IF c.history_epoch = new_epoch
       AND c.cursor_xid < pg_catalog.pg_snapshot_xmax(pg_catalog.pg_current_snapshot()) THEN
        RETURN QUERY SELECT c.cursor_xid::text, c.cursor_job_id, c.history_epoch;
        RETURN;
    END IF;
    UPDATE outbox.job AS j SET xid = '1'
     WHERE j.state = 'stream' AND j.queue = stream_rebase.queue
       AND j.stream_partition = stream_rebase.stream_partition
       AND j.xid <> '1' AND (j.xid, j.job_id) <= (c.cursor_xid, c.cursor_job_id)
       AND j.job_id <= c.cursor_job_id;
    UPDATE outbox.job AS j SET xid = '2'
     WHERE j.state = 'stream' AND j.queue = stream_rebase.queue
       AND j.stream_partition = stream_rebase.stream_partition
       AND j.xid > '2';
    RETURN QUERY
    UPDATE outbox.stream_cursor AS s
       SET cursor_xid = '1', cursor_job_id = 9223372036854775807, history_epoch = new_epoch,
           advanced_at = now()
     WHERE s.queue = stream_rebase.queue AND s.partition = stream_rebase.stream_partition
    RETURNING s.cursor_xid::text, s.cursor_job_id, s.history_epoch;
END
$$;
