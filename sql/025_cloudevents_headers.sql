-- 025_cloudevents_headers.sql - a row's CloudEvents attributes are checked
-- when it is written, never found bad at publish time.
--
-- With --cloudevents, a producer sets an attribute of the row's event with a
-- header "ce_<name>" (ce_type, ce_subject, ce_dataschema, an extension of its
-- own). The relay sets the required attributes and its own (specversion, id,
-- source, time, datacontenttype, traceparent, tracestate, partitionkey,
-- sequence), and a name must be what CloudEvents allows: [a-z0-9], at most 20
-- characters. A value is a string without control characters (the spec's rule
-- for strings, and what keeps a header line of NATS or HTTP whole).
--
-- Every insert whose headers hold a "ce_" key is checked by a trigger, so
-- enqueue(), enqueue_batch() and a plain INSERT refuse a bad one alike with
-- SQLSTATE 22023 and a message naming the header; the row is never written,
-- so it can never turn dead later. The relay also leaves a bad attribute out
-- of the event (rows written before this migration) instead of failing it.
--
-- Cost: rows without headers pay one comparison in the trigger's WHEN
-- clause; rows with headers a jsonpath test; only rows with a "ce_" header
-- run the function.
--
-- Locks: SHARE ROW EXCLUSIVE on outbox.job for a moment (CREATE TRIGGER),
-- no pass over the rows.

CREATE FUNCTION outbox.check_cloudevents_headers() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    header record;
BEGIN
    FOR header IN SELECT h.key, h.value FROM pg_catalog.jsonb_each_text(NEW.headers) AS h
                  WHERE pg_catalog.starts_with(h.key, 'ce_')
    LOOP
        IF header.key !~ '^ce_[a-z0-9]{1,20}$' THEN
            RAISE EXCEPTION 'outbox header % is not a CloudEvents attribute: after ce_ a name is 1 to 20 characters of a-z 0-9',
                            pg_catalog.to_json(pg_catalog.left(header.key, 60))
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF header.key IN ('ce_specversion', 'ce_id', 'ce_source', 'ce_time', 'ce_datacontenttype',
                          'ce_data', 'ce_traceparent', 'ce_tracestate', 'ce_partitionkey',
                          'ce_sequence') THEN
            RAISE EXCEPTION 'outbox header % sets a CloudEvents attribute the relay sets itself',
                            pg_catalog.to_json(header.key)
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'the relay sets specversion, id, source, time, datacontenttype, traceparent, tracestate (from outbox.traceparent), partitionkey (the ordering key) and sequence';
        END IF;
        IF header.value IS NULL OR header.value ~ '[\x01-\x1f\x7f]' OR header.value = '' THEN
            RAISE EXCEPTION 'outbox header % must be a non-empty string without control characters',
                            pg_catalog.to_json(header.key)
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END LOOP;
    RETURN NEW;
END
$$;

CREATE TRIGGER job_cloudevents_headers
    BEFORE INSERT ON outbox.job
    FOR EACH ROW
    WHEN (NEW.headers <> '{}'
          AND pg_catalog.jsonb_path_exists(NEW.headers, 'strict $.keyvalue() ? (@.key starts with "ce_")',
                                         '{}', true))
    EXECUTE FUNCTION outbox.check_cloudevents_headers();
