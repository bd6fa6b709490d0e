-- 024: a relay's statistics watch known by the login role of its session,
-- not of the lease call. A relay keeps one watch connection per PostgreSQL
-- server, made with the first listed database's URL of that server; with a
-- login role per tenant database (common for database-per-tenant), migration
-- 020 recorded each database's member under that database's role, which the
-- watch session never has, so no watch kept those leases: every database was
-- visited four times a lease, each visit a connect (idle PostgreSQL CPU 1.9 %
-- -> 46.9 % of a core, p50 113 -> 546 ms). The relay now names its watch
-- session's backend pid on that server: the member records the role of the
-- session of that pid and the watch's name, which only the relay's own watch
-- has (a tenant's session under a watch's name has another pid); without
-- such a session, the caller's role as before.
--
-- Locks: none on outbox.job.

CREATE FUNCTION outbox.database_lease_take(relay_id text, lease_seconds integer,
                                           watch text, watch_pid integer,
                                                      OUT held boolean, OUT owner text,
                                                      OUT generation bigint, OUT paused boolean,
                                                      OUT wins boolean, OUT owner_watched boolean)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    now_ timestamptz := pg_catalog.clock_timestamp();
    span interval := pg_catalog.make_interval(secs => lease_seconds);
    me text := database_lease_take.relay_id;
    login_role oid;
    winner text;
    lease outbox.database_lease;
    owner_live boolean;
BEGIN
    IF database_lease_take.watch IS NOT NULL THEN
        SELECT a.usesysid INTO login_role FROM pg_catalog.pg_stat_activity AS a
         WHERE a.pid = database_lease_take.watch_pid
           AND a.application_name = database_lease_take.watch;
    END IF;
    IF database_lease_take.watch IS NOT NULL AND login_role IS NULL THEN
        SELECT r.oid INTO login_role FROM pg_catalog.pg_roles AS r WHERE r.rolname = session_user;
    END IF;
    INSERT INTO outbox.relay_member AS m (relay_id, seen_until, watch, watch_role)
        VALUES (me, now_ + span / 2, database_lease_take.watch, login_role)
        ON CONFLICT ON CONSTRAINT relay_member_pkey
        DO UPDATE SET seen_until = excluded.seen_until, watch = excluded.watch,
                      watch_role = excluded.watch_role
        WHERE m.watch IS DISTINCT FROM excluded.watch
           OR m.watch_role IS DISTINCT FROM excluded.watch_role
           OR (excluded.watch IS NULL AND m.seen_until < now_ + span / 4);
    DELETE FROM outbox.relay_member AS m
     WHERE m.seen_until < now_ - interval '1 hour'
       AND m.relay_id NOT IN (SELECT r.relay_id FROM outbox.relay_members(span) AS r
                               WHERE r.live);
    SELECT r.relay_id INTO winner FROM outbox.relay_members(span) AS r
     WHERE r.live OR r.relay_id = me
     ORDER BY pg_catalog.md5(r.relay_id || ':' || pg_catalog.current_database()) DESC, r.relay_id
     LIMIT 1;
    wins := coalesce(winner = me, false);
    SELECT * INTO lease FROM outbox.database_lease AS l FOR UPDATE;
    SELECT r.watched, r.live INTO owner_watched, owner_live
      FROM outbox.relay_members(span) AS r WHERE r.relay_id = lease.owner;
    owner_watched := coalesce(owner_watched, false);
    owner_live := lease.owner IS NOT NULL
              AND (lease.owner = me
                   OR (coalesce(owner_live, false)
                       AND (owner_watched OR coalesce(lease.lease_until > now_, false))));
    paused := lease.paused_at IS NOT NULL;
    IF paused THEN
        UPDATE outbox.database_lease AS l SET owner = NULL, lease_until = NULL
         WHERE l.owner IS NOT NULL;
        held := false;
    ELSIF lease.owner = me THEN
        held := wins;
        IF NOT held THEN
            UPDATE outbox.database_lease AS l SET owner = NULL, lease_until = NULL;
        ELSIF NOT owner_watched THEN
            UPDATE outbox.database_lease AS l SET lease_until = now_ + span
             WHERE l.lease_until IS NULL OR l.lease_until < now_ + span / 2;
        END IF;
    ELSIF NOT owner_live AND wins THEN
        UPDATE outbox.database_lease AS l
           SET owner = me, generation = l.generation + 1, lease_until = now_ + span;
        held := true;
    ELSE
        held := false;
    END IF;
    SELECT l.owner, l.generation INTO owner, generation FROM outbox.database_lease AS l;
    IF owner IS DISTINCT FROM lease.owner THEN
        -- a free lease waits for the winner: whether its watch keeps it alive
        SELECT r.watched INTO owner_watched
          FROM outbox.relay_members(span) AS r WHERE r.relay_id = coalesce(owner, winner);
        owner_watched := coalesce(owner_watched, false);
    END IF;
END
$$;

-- Migration 020's form: the watch's role is the caller's.
CREATE OR REPLACE FUNCTION outbox.database_lease_take(relay_id text, lease_seconds integer,
                                                      watch text,
                                                      OUT held boolean, OUT owner text,
                                                      OUT generation bigint, OUT paused boolean,
                                                      OUT wins boolean, OUT owner_watched boolean)
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT t.held, t.owner, t.generation, t.paused, t.wins, t.owner_watched
      FROM outbox.database_lease_take(relay_id, lease_seconds, watch, NULL::integer) AS t
$$;

REVOKE ALL ON FUNCTION outbox.database_lease_take(text, integer, text, integer) FROM PUBLIC;

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'outbox_relay') THEN
        GRANT EXECUTE ON FUNCTION outbox.database_lease_take(text, integer, text, integer)
            TO outbox_relay;
    END IF;
END
$$;
