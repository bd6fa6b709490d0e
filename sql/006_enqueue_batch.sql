-- 006_enqueue_batch.sql - outbox.enqueue_batch(): many rows of one queue in one statement.
--
-- outbox.enqueue() costs a function call and an INSERT per row; a bulk load
-- through it runs at about a quarter of a bare INSERT ... SELECT. This one
-- inserts the whole array in one INSERT ... SELECT FROM unnest(...) and keeps
-- what enqueue() promises, row by row:
--
--   validation      the same checks with the same errors (SQLSTATE and text)
--   idempotency     a key already present in the queue returns the existing
--                   job_id; a key repeated inside one call inserts its first
--                   row and returns that row's job_id for every repeat
--   ordering        rows of one ordering key get rising job_ids in array
--                   order; each is held behind an unfinished earlier row of
--                   its key, in the table or earlier in the same call
--   routing, trace  exchange and routing_key as enqueue() takes them; the
--                   session's outbox.traceparent / outbox.tracestate go into
--                   the headers unless they hold a traceparent (004's
--                   check_destination() and trace_headers(), once per call)
--
-- Returns the job_ids in payload order. Adds a function only: no lock on
-- outbox.job beyond what CREATE FUNCTION takes in the catalog.

-- The rows one call inserts (or finds), with the job_ids returned in payload
-- order. headers, priority, run_at, max_attempts, exchange and routing_key
-- apply to every row of the call.
CREATE FUNCTION outbox.enqueue_batch(
    queue            text,
    payloads         jsonb[],
    idempotency_keys text[] DEFAULT NULL,
    ordering_keys    text[] DEFAULT NULL,
    headers          jsonb DEFAULT '{}',
    priority         int DEFAULT 0,
    run_at           timestamptz DEFAULT now(),
    max_attempts     int DEFAULT 10,
    exchange         text DEFAULT NULL,
    routing_key      text DEFAULT NULL
) RETURNS bigint[]
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    row_count int := coalesce(cardinality(enqueue_batch.payloads), 0);
    ids       bigint[];
BEGIN
    -- the checks of outbox.enqueue(), with its messages, once per call
    IF enqueue_batch.queue IS NULL OR length(enqueue_batch.queue) NOT BETWEEN 1 AND 200
       OR ltrim(enqueue_batch.queue, 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:-') <> '' THEN
        RAISE EXCEPTION 'invalid outbox queue name %', coalesce(quote_literal(left(enqueue_batch.queue, 60)), 'NULL')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'a queue name is 1 to 200 characters of A-Z a-z 0-9 . _ : -';
    END IF;
    -- flat arrays only, one key (or NULL) per payload
    IF array_ndims(enqueue_batch.payloads) > 1
       OR coalesce(array_ndims(enqueue_batch.idempotency_keys), 1) > 1
       OR coalesce(array_ndims(enqueue_batch.ordering_keys), 1) > 1 THEN
        RAISE EXCEPTION 'outbox enqueue_batch takes one-dimensional arrays'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF enqueue_batch.payloads IS NULL OR array_position(enqueue_batch.payloads, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'outbox payload must not be NULL'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF enqueue_batch.headers IS NULL
       OR (enqueue_batch.headers <> '{}' AND NOT outbox.headers_are_strings(enqueue_batch.headers)) THEN
        RAISE EXCEPTION 'outbox headers must be a JSON object of string values'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF enqueue_batch.max_attempts IS NULL OR enqueue_batch.max_attempts < 1 THEN
        RAISE EXCEPTION 'outbox max_attempts must be positive, got %', coalesce(enqueue_batch.max_attempts::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF enqueue_batch.exchange IS NOT NULL OR enqueue_batch.routing_key IS NOT NULL THEN
        PERFORM outbox.check_destination('exchange', enqueue_batch.exchange),
                outbox.check_destination('routing key', enqueue_batch.routing_key);
    END IF;
    IF cardinality(enqueue_batch.idempotency_keys) <> row_count THEN
        RAISE EXCEPTION 'outbox enqueue_batch got % idempotency keys for % payloads',
                        cardinality(enqueue_batch.idempotency_keys), row_count
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'pass one key per payload, NULL for none';
    END IF;
    IF cardinality(enqueue_batch.ordering_keys) <> row_count THEN
        RAISE EXCEPTION 'outbox enqueue_batch got % ordering keys for % payloads',
                        cardinality(enqueue_batch.ordering_keys), row_count
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'pass one key per payload, NULL for none';
    END IF;
    IF row_count = 0 THEN
        RETURN '{}';
    END IF;
    -- the trace context of the session; one settings lookup when there is none
    IF current_setting('outbox.traceparent', true) <> '' THEN
        enqueue_batch.headers := outbox.trace_headers(enqueue_batch.headers);
    END IF;

    -- All rows new, none keyed: one INSERT ... SELECT. Identity values are
    -- drawn in the order the rows are inserted, which is array order.
    IF enqueue_batch.idempotency_keys IS NULL AND enqueue_batch.ordering_keys IS NULL THEN
        WITH inserted AS (
            INSERT INTO outbox.job (queue, payload, headers, priority, run_at, max_attempts,
                                    exchange, routing_key)
            SELECT enqueue_batch.queue, p, enqueue_batch.headers, coalesce(enqueue_batch.priority, 0),
                   coalesce(enqueue_batch.run_at, now()), enqueue_batch.max_attempts,
                   enqueue_batch.exchange, enqueue_batch.routing_key
            FROM unnest(enqueue_batch.payloads) AS p
            RETURNING job_id)
        SELECT array_agg(job_id ORDER BY job_id) INTO ids FROM inserted;
        RETURN ids;
    END IF;

    -- Keyed rows. A key already in the queue returns its row; the first row
    -- of each new key goes in and its repeats return it; a row is held behind
    -- an unfinished row of its ordering key, in the table or earlier in this
    -- call. A concurrent insert of the same key makes ON CONFLICT wait for it
    -- and skip the row, and the next round finds it (as would a row purged
    -- in between: the next round inserts it). ids keeps what earlier rounds
    -- found, so no row goes in twice.
    FOR attempt IN 1..3 LOOP
        WITH source AS (
            SELECT r.ord::int AS ord, r.payload, r.idempotency_key, r.ordering_key,
                   r.idempotency_key IS NULL
                   OR r.ord = min(r.ord) OVER (PARTITION BY r.idempotency_key) AS first_of_key
            FROM unnest(enqueue_batch.payloads, enqueue_batch.idempotency_keys,
                        enqueue_batch.ordering_keys)
                 WITH ORDINALITY AS r(payload, idempotency_key, ordering_key, ord)),
        existing AS (
            SELECT j.idempotency_key, j.job_id FROM outbox.job AS j
            WHERE j.queue = enqueue_batch.queue
              AND j.idempotency_key = ANY (enqueue_batch.idempotency_keys)),
        -- the keys with an unfinished row in the table: one probe per distinct key
        busy_keys AS (
            SELECT k.ordering_key
            FROM (SELECT DISTINCT s.ordering_key FROM source AS s
                  WHERE s.ordering_key IS NOT NULL) AS k
            WHERE EXISTS (SELECT 1 FROM outbox.job AS e
                          WHERE e.queue = enqueue_batch.queue AND e.ordering_key = k.ordering_key
                            AND e.state IN ('ready', 'running'))),
        to_insert AS (
            SELECT s.ord, s.payload, s.idempotency_key, s.ordering_key,
                   s.ordering_key IS NOT NULL
                   AND (s.ord > min(s.ord) OVER (PARTITION BY s.ordering_key)
                        OR s.ordering_key IN (SELECT b.ordering_key FROM busy_keys AS b)) AS held
            FROM source AS s
            WHERE s.first_of_key AND ids[s.ord] IS NULL
              AND NOT EXISTS (SELECT 1 FROM existing AS x
                              WHERE x.idempotency_key = s.idempotency_key)),
        inserted AS (
            INSERT INTO outbox.job (queue, payload, headers, idempotency_key, priority, run_at,
                                    max_attempts, ordering_key, exchange, routing_key, held)
            SELECT enqueue_batch.queue, t.payload, enqueue_batch.headers, t.idempotency_key,
                   coalesce(enqueue_batch.priority, 0), coalesce(enqueue_batch.run_at, now()),
                   enqueue_batch.max_attempts, t.ordering_key, enqueue_batch.exchange,
                   enqueue_batch.routing_key, t.held
            FROM to_insert AS t ORDER BY t.ord
            ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
            RETURNING job_id, idempotency_key),
        -- keyless rows never conflict: the n-th of them inserted is the n-th in array order
        keyless_ids AS (
            SELECT array_agg(i.job_id ORDER BY i.job_id) AS job_ids
            FROM inserted AS i WHERE i.idempotency_key IS NULL),
        keyless AS (
            SELECT t.ord,
                   (SELECT k.job_ids FROM keyless_ids AS k)[row_number() OVER (ORDER BY t.ord)] AS job_id
            FROM to_insert AS t WHERE t.idempotency_key IS NULL)
        SELECT array_agg(coalesce(ids[s.ord], x.job_id, i.job_id, k.job_id) ORDER BY s.ord)
        INTO ids
        FROM source AS s
        LEFT JOIN existing AS x ON x.idempotency_key = s.idempotency_key
        LEFT JOIN inserted AS i ON i.idempotency_key = s.idempotency_key
        LEFT JOIN keyless AS k ON k.ord = s.ord;

        IF array_position(ids, NULL) IS NULL THEN
            RETURN ids;
        END IF;
    END LOOP;
    RAISE EXCEPTION 'outbox idempotency keys of queue % kept changing', enqueue_batch.queue
        USING ERRCODE = 'serialization_failure';
END
$$;
