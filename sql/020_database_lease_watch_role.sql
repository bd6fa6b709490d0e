-- 020: a relay's statistics watch session is known by its login role as well
-- as by its name. Any session may take any application_name, and
-- pg_stat_activity shows every session's name to every role: a tenant's
-- application naming its session after a killed relay's watch ('outbox-relay
-- watch <uuid>') and running queries kept that relay alive for migration 019's
-- functions on every database of the server, so the databases it held were
-- served by no relay for as long as the session ran. A member now records
-- the role it logged in as (the lease call's session_user: its relay's
-- connections and its watch use the same URL's login) and a watch session
-- counts only under that role. Members recorded before this migration get
-- the role of the sessions of their watch's name running now, when those
-- are of one role; the others count as gone until their relay's next call.
--
-- Locks: outbox.relay_member for a moment (a column without a default, one
-- update of its rows); nothing on outbox.job.

ALTER TABLE outbox.relay_member ADD COLUMN watch_role oid;

UPDATE outbox.relay_member AS m SET watch_role = s.role
  FROM (SELECT a.application_name AS name, min(a.usesysid) AS role
          FROM pg_catalog.pg_stat_activity AS a
         WHERE a.application_name LIKE 'outbox-relay watch %'
         GROUP BY a.application_name
        HAVING count(DISTINCT a.usesysid) = 1) AS s
 WHERE s.name = m.watch;

-- The members with whether each is alive now, and whether its statistics
-- watch is what keeps it alive: a session of its watch's name and role.
CREATE OR REPLACE FUNCTION outbox.relay_members(span interval,
                                                OUT relay_id text, OUT live boolean,
                                                OUT watched boolean)
RETURNS SETOF record
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    WITH session AS (
        SELECT a.application_name AS name, a.usesysid AS role, max(a.query_start) AS active_at
          FROM pg_catalog.pg_stat_activity AS a
         WHERE a.application_name LIKE 'outbox-relay watch %'
         GROUP BY a.application_name, a.usesysid
    )
    SELECT m.relay_id,
           CASE WHEN m.watch IS NULL THEN m.seen_until > pg_catalog.clock_timestamp()
                WHEN s.name IS NULL THEN false -- its watch ended: the relay is gone
                WHEN s.active_at > pg_catalog.clock_timestamp() - span THEN true
                ELSE m.seen_until > pg_catalog.clock_timestamp()
           END,
           m.watch IS NOT NULL AND s.active_at > pg_catalog.clock_timestamp() - span
      FROM outbox.relay_member AS m
      LEFT JOIN session AS s ON s.name = m.watch AND s.role = m.watch_role
$$;

-- Migration 019's function, recording the member's role with its watch.
CREATE OR REPLACE FUNCTION outbox.database_lease_take(relay_id text, lease_seconds integer,
                                                      watch text,
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

-- The lease of the database is the relays' (sql/roles/outbox_relay_role.sql
-- grants them these): a producer that could call them would fake members, or
-- take and give up its own database's lease, and so stop or churn its delivery.
REVOKE ALL ON FUNCTION outbox.database_lease_take(text, integer, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox.database_lease_take(text, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox.database_lease_release(text) FROM PUBLIC;

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'outbox_relay') THEN
        GRANT EXECUTE ON FUNCTION outbox.database_lease_take(text, integer, text),
                                  outbox.database_lease_take(text, integer),
                                  outbox.database_lease_release(text) TO outbox_relay;
    END IF;
END
$$;
