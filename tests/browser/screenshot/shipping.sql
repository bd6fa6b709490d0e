-- shipping: a third database of the list, quiet.
INSERT INTO outbox.job (queue, payload, state, attempts, created_at, finished_at)
SELECT 'labels', jsonb_build_object('n', n), 'succeeded', 1,
       now() - make_interval(mins => n / 2), now() - make_interval(mins => n / 2)
  FROM generate_series(1, 90) AS n;
INSERT INTO outbox.job (queue, payload) VALUES ('labels', '{"parcel": "JD0144"}');
