-- 007_autovacuum.sql - autovacuum that keeps up with a queue table.
--
-- Every row of outbox.job is inserted, updated at least twice (claim, then
-- complete or fail) and deleted by the retention cleanup: each of those
-- leaves a dead row version. PostgreSQL's defaults wait for 20 % of the
-- table to be dead before vacuuming it (autovacuum_vacuum_scale_factor 0.2),
-- which for a table that is mostly churn means the table and its indexes
-- grow to several times their live size before the first vacuum, and then
-- each vacuum is throttled (cost limit 200) while the churn goes on.
--
-- Here the trigger is a fixed number of dead versions, whatever the table
-- size, and a vacuum of this table runs at ten times the default cost limit
-- with the default 2 ms delay: a table of a few hundred thousand rows is
-- vacuumed in seconds. Inserts alone trigger a vacuum too (it marks pages
-- all-visible for index-only scans), and analyze follows the churn so the
-- claim's plans see the real size of the ready set. The figures were chosen
-- by measurement (docs/operating.md, "Vacuum"); autovacuum_naptime (how
-- often the launcher looks, 1 min by default) is server-wide and not set
-- here.
--
-- ALTER TABLE ... SET (storage parameters) takes SHARE UPDATE EXCLUSIVE on
-- outbox.job for an instant: producers and relays go on (it waits only for a
-- running vacuum or another schema change) and no row is rewritten.
ALTER TABLE outbox.job SET (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 20000,
    autovacuum_vacuum_insert_scale_factor = 0,
    autovacuum_vacuum_insert_threshold = 100000,
    autovacuum_analyze_scale_factor = 0,
    autovacuum_analyze_threshold = 50000,
    autovacuum_vacuum_cost_limit = 2000,
    autovacuum_vacuum_cost_delay = 2
);
