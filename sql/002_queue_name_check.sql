-- 002_queue_name_check.sql - the same queue name rule, about 70 times cheaper.
--
-- PostgreSQL checks every CHECK constraint on every UPDATE, so job_queue_name
-- runs on each claim, extend, complete and fail, not only on insert. Its
-- first form, queue ~ '^[A-Za-z0-9._:-]{1,200}$', costs about 10 us a row:
-- the bounded repetition {1,200} makes the regular expression engine track
-- 200 states. A length test plus a search for any character outside the
-- class accepts and rejects exactly the same names at about 0.15 us, which
-- took about a sixth of PostgreSQL's CPU time off claim + complete.
--
-- Re-adding the constraint scans the table once under its lock (about half a
-- second per million rows); every row already satisfies it, since the old
-- form was the same rule.
ALTER TABLE outbox.job
    DROP CONSTRAINT job_queue_name,
    ADD CONSTRAINT job_queue_name
        CHECK (length(queue) BETWEEN 1 AND 200 AND queue !~ '[^A-Za-z0-9._:-]');
