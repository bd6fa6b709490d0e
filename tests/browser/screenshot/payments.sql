-- payments: a second database of the list, with dead rows of its own.
INSERT INTO outbox.job (queue, payload, state, attempts, created_at, finished_at)
SELECT 'payments', jsonb_build_object('n', n), 'succeeded', 1,
       now() - make_interval(mins => n / 4), now() - make_interval(mins => n / 4)
  FROM generate_series(1, 200) AS n;
INSERT INTO outbox.job (queue, payload)
SELECT 'payments', jsonb_build_object('payment', 'pay_' || n) FROM generate_series(1, 3) AS n;
INSERT INTO outbox.job (queue, payload, state, attempts, max_attempts, finished_at, last_error)
VALUES ('refunds', '{"refund": "re_2291"}', 'dead', 10, 10, now() - interval '6 minutes',
        'rejected: stream key ''outbox:refunds'' is not a stream'),
       ('refunds', '{"refund": "re_2294"}', 'dead', 10, 10, now() - interval '5 minutes',
        'rejected: stream key ''outbox:refunds'' is not a stream');
