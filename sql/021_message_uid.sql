-- 021_message_uid.sql - every row carries an identity of its own: message ids
-- no longer depend on the relay guessing the database's history.
--
-- Message ids of 015 are <database_id>:<epoch>:<job_id>, and the epoch moves
-- only when a relay sees the cluster's system identifier or timeline change.
-- A cold copy started in place, two standbys promoted one after the other, a
-- PITR done twice, a dump restored twice, a TEMPLATE copy: each is a second
-- history that hands out the same job ids under the same epoch, and a broker
-- (or a consumer) deduplicating on the id drops the new rows.
--
-- Now each row draws, at its insert, a random uuid no producer chooses:
-- outbox.job.message_uid. A row copied into two histories keeps it (a true
-- duplicate, deduplicated as one); a row inserted in either history after
-- they split has its own, and can never collide. The message id of the new
-- form 'uid' is
--
--     <database_id>:<message_uid>            (a replayed row: ...<uuid>.r<n>)
--
-- and every broker-side dedup key (Redis' dedup records, NATS' Nats-Msg-Id)
-- is that id, whatever the database's form. A database that never handed
-- out a job id takes the form 'uid'; one with a history keeps its form
-- ('database' or 'job') until an operator switches with `outboxctl identity
-- set --id-form uid`, so that no consumer sees its ids change under it.
--
-- Rows inserted before this migration have no message_uid (NULL): the
-- relay's statements use in its place a uuid made of the row's job id and
-- insert time to the microsecond (see OUTBOX_SQL_MESSAGE_UID in
-- src/store_statements.h): the same for the row in every history it is
-- copied into, another for a row inserted under the same job id in another
-- history.
--
-- Locks: ADD COLUMN without a default, then SET DEFAULT, changes the catalog
-- only: PostgreSQL 15 would fill a volatile default by rewriting the table
-- under ACCESS EXCLUSIVE. Nothing is backfilled. The function replaced keeps
-- its name and adds an output column.

ALTER TABLE outbox.job ADD COLUMN message_uid uuid;
ALTER TABLE outbox.job ALTER COLUMN message_uid SET DEFAULT pg_catalog.gen_random_uuid();

COMMENT ON COLUMN outbox.job.message_uid IS
    'the row''s own identity, drawn at insert (NULL for rows inserted before migration 021): message ids and broker dedup keys are made of it';

-- ---- the new form ------------------------------------------------------------

ALTER TABLE outbox.identity DROP CONSTRAINT identity_id_form;
ALTER TABLE outbox.identity ADD CONSTRAINT identity_id_form CHECK (id_form IN ('uid', 'database', 'job'));

COMMENT ON TABLE outbox.identity IS
    'this database''s identity: message ids are <database_id>:<message_uid> (form uid), or an earlier form until an operator switches';

-- A database that never handed out a job id takes the new form.
DO $$
DECLARE
    used boolean;
BEGIN
    EXECUTE format('SELECT is_called FROM %s', pg_catalog.pg_get_serial_sequence('outbox.job', 'job_id'))
       INTO used;
    IF NOT used AND NOT EXISTS (SELECT 1 FROM outbox.job) THEN
        UPDATE outbox.identity SET id_form = 'uid', changed_at = now() WHERE id_form = 'database';
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION outbox.identity_set(new_database_id text, new_id_form text DEFAULT NULL)
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
    IF new_id_form IS NOT NULL AND new_id_form NOT IN ('uid', 'database', 'job') THEN
        RAISE EXCEPTION 'outbox id form must be uid, database or job, got %',
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

-- As in 015, and says whether this call moved the epoch (history_changed):
-- a relay warns then when the database's ids are of an earlier form, which
-- the history change may make collide. The epoch stays for those forms and
-- for the stream cursors' places.
DROP FUNCTION outbox.identity_observe();
CREATE FUNCTION outbox.identity_observe(OUT database_id text, OUT id_form text, OUT epoch integer,
                                        OUT history_changed boolean)
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
    history_changed := FOUND;
    SELECT i.database_id, i.id_form, i.epoch INTO database_id, id_form, epoch FROM outbox.identity AS i;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'outbox.identity has no row: run outboxctl migrate'
            USING ERRCODE = 'undefined_object';
    END IF;
END
$$;

-- ---- producers never choose it -----------------------------------------------

-- A producer's role inserts every column but message_uid (the default fills
-- it): a forged uid would make a broker drop another row as its duplicate.
DO $$
DECLARE
    cols text;
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'outbox_producer')
       AND pg_catalog.has_table_privilege('outbox_producer', 'outbox.job', 'INSERT') THEN
        SELECT string_agg(quote_ident(a.attname), ', ' ORDER BY a.attnum) INTO cols
          FROM pg_catalog.pg_attribute AS a
         WHERE a.attrelid = 'outbox.job'::regclass AND a.attnum > 0 AND NOT a.attisdropped
           AND a.attname <> 'message_uid';
        REVOKE INSERT ON outbox.job FROM outbox_producer;
        EXECUTE format('GRANT INSERT (%s) ON outbox.job TO outbox_producer', cols);
    END IF;
END
$$;

-- ---- the inbox takes the new form --------------------------------------------

-- As in 015; a message id of the form uid carries no order of its own: it is
-- taken once, by its id, through the plain inbox. A key's rows reach the
-- broker in order and each publish of a row carries the same id, so a late
-- publish of a stale batch is a repeat of an id already taken.
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
    IF $3 IS NULL
       OR $2 ~ '^[A-Za-z0-9_-]{1,40}:[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}(\.r[0-9]{1,9})?$' THEN
        RETURN outbox.inbox_accept($1, $2);
    END IF;
    part := pg_catalog.regexp_match($2, '^(?:([A-Za-z0-9_-]{1,40}):([0-9]{1,9}):)?([0-9]{1,19})(\.r[0-9]{1,9})?$');
    IF part IS NULL OR part[3]::numeric > 9223372036854775807 THEN
        RAISE EXCEPTION 'outbox inbox_accept with an ordering key needs a message id of the relay (<database>:<uuid>, <database>:<epoch>:<job_id>, or a job id), got %',
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
