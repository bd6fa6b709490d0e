-- 023: an insert into outbox.job reaches the statistics of its database at
-- its commit. A relay of a list (outbox-relay --databases) learns that an
-- idle database has a new row from pg_stat_database, read by its statistics
-- watch on one connection per server (relay/scheduler_watch.c). A backend
-- reports its row counts when its transaction ends, but at most once a
-- second: a commit within a second of the backend's last report (a pooled
-- session that updated a business row, or only ran a SELECT, 0.3 s before
-- enqueuing) reached the statistics when that backend next ended a
-- transaction a second later, or after it had been idle for 10 s, and its
-- row waited that long (2.2-10.1 s). pg_stat_force_next_flush() (PostgreSQL
-- 15) has the backend report at the end of the inserting transaction, before
-- the client hears of the commit, whatever it reported before.
--
-- A statement trigger, BEFORE so that it needs no after-trigger queue: one
-- call per INSERT statement, whatever its row count. The trigger only asks
-- for the report: an insert that fails asks for a report that has nothing
-- new. Every name is schema-qualified; the function still pins its
-- search_path, as every function of the schema does (a GUC save and restore
-- once per INSERT statement, not per row).
-- PostgreSQL before 15 has no such function: the trigger is not made there,
-- and its rows wake as before.
--
-- Locks: CREATE TRIGGER holds SHARE ROW EXCLUSIVE on outbox.job for a
-- moment (inserts wait, reads do not).

DO $$
BEGIN
    IF pg_catalog.to_regproc('pg_catalog.pg_stat_force_next_flush') IS NULL THEN
        RAISE NOTICE 'PostgreSQL % has no pg_stat_force_next_flush(): rows wake list relays '
                     'when their backend next reports its statistics',
                     pg_catalog.current_setting('server_version');
        RETURN;
    END IF;
    EXECUTE $f$
        CREATE FUNCTION outbox.job_insert_wake() RETURNS trigger
        LANGUAGE plpgsql
        SET search_path = pg_catalog, pg_temp
        AS $body$
        BEGIN
            PERFORM pg_catalog.pg_stat_force_next_flush();
            RETURN NULL;
        END
        $body$
    $f$;
    CREATE TRIGGER job_insert_wake
        BEFORE INSERT ON outbox.job
        FOR EACH STATEMENT
        EXECUTE FUNCTION outbox.job_insert_wake();
END
$$;
