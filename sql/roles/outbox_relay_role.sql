-- outbox_relay_role.sql - least-privilege roles for the outbox.
--
-- Not a numbered migration (outboxctl migrate never runs it): a separate
-- script an administrator runs once per database that holds outbox.job,
-- after `outboxctl migrate`, as the owner of the outbox schema or a
-- superuser, and again after an upgrade that adds objects. It is idempotent.
--
--   psql -v ON_ERROR_STOP=1 -d app -f sql/roles/outbox_relay_role.sql
--
-- It creates three group roles without LOGIN; give them to login roles:
--
--   CREATE ROLE relay_app LOGIN PASSWORD '...' IN ROLE outbox_relay;
--   GRANT outbox_producer TO orders_service;
--   GRANT outbox_reader TO monitoring;
--
--   outbox_relay     outbox-relay: claims, extends, completes, fails, releases
--                    and reaps rows (UPDATE; FOR UPDATE SKIP LOCKED needs it),
--                    deletes old succeeded rows (DELETE), samples the backlog
--                    (SELECT). It never inserts and owns nothing.
--   outbox_producer  services that enqueue: EXECUTE on outbox.enqueue() and
--                    outbox.enqueue_batch(), INSERT on outbox.job, plus SELECT
--                    on the columns they read (job_id, queue, idempotency_key,
--                    ordering_key, state) - not on payloads. No UPDATE, no
--                    DELETE. Only ready rows: the insert trigger of migration
--                    003 refuses any other shape (state, worker, lease,
--                    attempts) from a role that does not own outbox.job, and
--                    since migration 013 a job_id, created_at or replays of
--                    the producer's own.
--   outbox_reader    `outboxctl status`, `outboxctl dead list` and
--                    `outboxctl paused`: read only.
--   outbox_consumer  consumers that use the inbox: EXECUTE on
--                    outbox.inbox_accept() and INSERT on outbox.inbox (and
--                    on outbox.inbox_key, which the keyed accept updates).
--
-- `outboxctl dead retry`, `outboxctl purge` and `outboxctl replay` change
-- rows: run them as the schema owner, or as a login that is also in
-- outbox_relay. `outboxctl pause`, `resume` and `inbox purge` need the owner. `outboxctl
-- migrate` needs the owner of the schema.
--
-- pg_read_all_stats lets the relay's --horizon-warning and `outboxctl status`
-- see other roles' sessions in pg_stat_activity (who holds back vacuum). Only
-- a superuser (or a holder of it WITH ADMIN OPTION) can grant it; otherwise
-- the script says so in a NOTICE and goes on, and both only see their own
-- role's sessions.

DO $$
DECLARE
    name text;
BEGIN
    FOREACH name IN ARRAY ARRAY['outbox_relay', 'outbox_producer', 'outbox_reader',
                                'outbox_consumer'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = name) THEN
            EXECUTE format('CREATE ROLE %I NOLOGIN', name);
        END IF;
    END LOOP;
END
$$;

-- Functions are executable by PUBLIC by default; enqueue is for producers only.
REVOKE ALL ON FUNCTION outbox.enqueue(text, jsonb, text, jsonb, integer, timestamptz, integer,
                                      text, text, text)
    FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox.enqueue_batch(text, jsonb[], text[], text[], jsonb, integer,
                                            timestamptz, integer, text, text)
    FROM PUBLIC;

GRANT USAGE ON SCHEMA outbox TO outbox_relay, outbox_producer, outbox_reader, outbox_consumer;

-- The relay.
GRANT SELECT, UPDATE, DELETE ON outbox.job TO outbox_relay;
-- the claim skips paused queues and keys (migration 005)
GRANT SELECT ON outbox.paused TO outbox_relay;
-- The schema version, which the relay checks at start.
GRANT SELECT ON outbox.schema_migrations TO outbox_relay;

-- Producers.
GRANT EXECUTE ON FUNCTION outbox.enqueue(text, jsonb, text, jsonb, integer, timestamptz, integer,
                                         text, text, text)
    TO outbox_producer;
GRANT EXECUTE ON FUNCTION outbox.enqueue_batch(text, jsonb[], text[], text[], jsonb, integer,
                                            timestamptz, integer, text, text)
    TO outbox_producer;
-- every column but message_uid, which the default fills (migration 021)
DO $$
DECLARE
    cols text;
BEGIN
    SELECT string_agg(quote_ident(a.attname), ', ' ORDER BY a.attnum) INTO cols
      FROM pg_catalog.pg_attribute AS a
     WHERE a.attrelid = 'outbox.job'::regclass AND a.attnum > 0 AND NOT a.attisdropped
       AND a.attname <> 'message_uid';
    REVOKE INSERT ON outbox.job FROM outbox_producer;
    EXECUTE format('GRANT INSERT (%s) ON outbox.job TO outbox_producer', cols);
END
$$;
GRANT SELECT (job_id, queue, idempotency_key, ordering_key, state) ON outbox.job TO outbox_producer;

-- Read-only status.
GRANT SELECT ON outbox.job, outbox.schema_migrations, outbox.paused TO outbox_reader;

-- Stream queues (migration 009): the relay owns partitions through their
-- cursors; the reader sees them.
GRANT SELECT ON outbox.stream TO outbox_relay, outbox_reader;
GRANT SELECT, UPDATE ON outbox.stream_cursor TO outbox_relay;
GRANT SELECT ON outbox.stream_cursor TO outbox_reader;
-- Relays publishing streams (migration 010), so that partitions spread among them.
GRANT SELECT, INSERT, UPDATE, DELETE ON outbox.stream_member TO outbox_relay;
GRANT SELECT ON outbox.stream_member TO outbox_reader;
-- Lease generations that never repeat (migration 014).
GRANT USAGE ON SEQUENCE outbox.stream_generation TO outbox_relay;
-- The last place of each ordering key (migration 014): the relay deletes those below the horizon,
-- a batch locked FOR UPDATE SKIP LOCKED at a time, which asks UPDATE on a column (migration 028).
GRANT SELECT, DELETE ON outbox.stream_key TO outbox_relay;
GRANT UPDATE (place_xid) ON outbox.stream_key TO outbox_relay;
GRANT SELECT ON outbox.stream_key TO outbox_reader;
-- The database's identity (migration 015): the relay moves its history epoch
-- through outbox.identity_observe() (SECURITY DEFINER), status shows it;
-- outbox.identity_set() stays the owner's.
GRANT SELECT ON outbox.identity TO outbox_relay, outbox_reader;
-- The lease of a whole database among relays of a list (migrations 018-020, 024):
-- the relays' alone.
REVOKE ALL ON FUNCTION outbox.database_lease_take(text, integer, text, integer),
                       outbox.database_lease_take(text, integer, text),
                       outbox.database_lease_take(text, integer),
                       outbox.database_lease_release(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION outbox.database_lease_take(text, integer, text, integer),
                          outbox.database_lease_take(text, integer, text),
                          outbox.database_lease_take(text, integer),
                          outbox.database_lease_release(text) TO outbox_relay;

-- Consumers' inbox (migration 005).
REVOKE ALL ON FUNCTION outbox.inbox_accept(text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION outbox.inbox_accept(text, text) TO outbox_consumer;
GRANT INSERT ON outbox.inbox TO outbox_consumer;
-- The inbox in key order (migration 008).
REVOKE ALL ON FUNCTION outbox.inbox_accept(text, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION outbox.inbox_accept(text, text, text) TO outbox_consumer;
GRANT SELECT, INSERT, UPDATE ON outbox.inbox_key TO outbox_consumer;

DO $$
BEGIN
    IF NOT pg_has_role('outbox_relay', 'pg_read_all_stats', 'MEMBER')
       OR NOT pg_has_role('outbox_reader', 'pg_read_all_stats', 'MEMBER') THEN
        GRANT pg_read_all_stats TO outbox_relay, outbox_reader;
    END IF;
EXCEPTION WHEN insufficient_privilege THEN
    RAISE NOTICE 'pg_read_all_stats not granted (needs a superuser): the xmin horizon figures will only show sessions of the same role';
END
$$;
