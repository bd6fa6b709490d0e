/*
 * timeouts.h - every time the programs wait, retry or repeat, in one table.
 *
 * liboutbox, outbox-relay and outboxctl read their timeouts, intervals and
 * backoffs from here and keep none of their own, so one file answers "how
 * long does it wait for that?". Each name carries its unit (_MS, _US,
 * _SECONDS) and the prefix of the module that uses it; a time several
 * modules share starts with TIMEOUT_. A value that is an option's default
 * says so; it changes together with that option's documentation
 * (docs/reference.md, the --help block).
 *
 * Values that libpq, PostgreSQL or an option read as text are written as
 * numbers here and turned into text with TIMEOUT_TEXT().
 */
#ifndef OUTBOX_TIMEOUTS_H
#define OUTBOX_TIMEOUTS_H

/* A value as a string literal: TIMEOUT_TEXT(STORE_STATEMENT_TIMEOUT_SECONDS) is "10". */
#define TIMEOUT_TEXT(value) TIMEOUT_TEXT_(value)
#define TIMEOUT_TEXT_(value) #value

/* ---- PostgreSQL: every connection of every program ------------------------------ */

/* libpq's connect_timeout, per host of the URL (the URL's own setting wins). */
#define TIMEOUT_DATABASE_CONNECT_SECONDS 10
/* TCP keepalives on an idle connection: the first probe after this long, then one per interval. */
#define TIMEOUT_DATABASE_KEEPALIVE_IDLE_SECONDS 10
#define TIMEOUT_DATABASE_KEEPALIVE_INTERVAL_SECONDS 5
/* libpq's tcp_user_timeout: data sent and unacknowledged this long drops the connection. */
#define TIMEOUT_DATABASE_UNACKNOWLEDGED_MS 15000

/* ---- the store (src/store*.c): statements of the relay's sessions --------------- */

/* The sessions' statement_timeout and lock_timeout: the server cancels a statement after it. */
#define STORE_STATEMENT_TIMEOUT_SECONDS 10
/* No answer this long after we began to wait: the server is stalled, the connection is dropped. */
#define STORE_STATEMENT_DEADLINE_MS (STORE_STATEMENT_TIMEOUT_SECONDS * 1000 + 2000)
/*
 * Pauses are read again before a claim once they are this old: a pause
 * then stops claims within this, plus one turn for the claim sent ahead,
 * well inside --poll-interval + 1 s. A read of the tiny table five times
 * a second costs a pipeline about 0.05 % of a core.
 */
#define STORE_PAUSES_MAX_AGE_SECONDS 0.2

/* ---- the broker: every sink --------------------------------------------------------- */

/* Connecting and the handshake (TCP, TLS, login), per endpoint: --broker-connect-timeout. */
#define TIMEOUT_BROKER_CONNECT_SECONDS 5
#define TIMEOUT_BROKER_CONNECT_MS (TIMEOUT_BROKER_CONNECT_SECONDS * 1000)
/* The longest wait for the broker without progress (a confirm, a reply): --broker-io-timeout. */
#define TIMEOUT_BROKER_IO_SECONDS 10
#define TIMEOUT_BROKER_IO_MS (TIMEOUT_BROKER_IO_SECONDS * 1000)
/* Heartbeat interval the relay asks of brokers that have one (AMQP); 0 disables. */
#define TIMEOUT_BROKER_HEARTBEAT_SECONDS 30

/* The AMQP sink's polite close at disconnect waits at most this long per step. */
#define SINK_AMQP_CLOSE_TIMEOUT_MS 2000
/* How long one look for Kafka delivery reports blocks. */
#define SINK_KAFKA_POLL_MS 50
/* Kafka's linger.ms: how long the producer gathers records into a request. */
#define SINK_KAFKA_LINGER_MS 5
/* The longest wait for a new topic's metadata (a quarter of the I/O timeout when shorter). */
#define SINK_KAFKA_PROPAGATION_MAX_MS 1000
/*
 * NATS: ask whether a stream covers the subjects of unanswered messages
 * after this long without an ack (at most half the I/O timeout): a subject
 * a core NATS subscriber listens on, with no stream behind it, gets no
 * answer at all, and its rows fail then instead of holding the batch.
 */
#define SINK_NATS_PROBE_AFTER_MS 500
/* NATS: ping an idle connection this often. */
#define SINK_NATS_IDLE_FLUSH_MS 2000
/* Redis: a job is appended at most once per stream within this window; --dedup-window's default. */
#define SINK_REDIS_DEDUP_WINDOW_DEFAULT_MS (24LL * 60 * 60 * 1000)
/* Redis: ping a connection idle this long. */
#define SINK_REDIS_IDLE_PING_MS 1000
/* Redis: how long WAIT waits for the replicas before the calls it follows are deferred. */
#define SINK_REDIS_WAIT_TIMEOUT_MS 1000

/* ---- the relay: connecting its ends (relay/ends.c, relay.c) ---------------------- */

/* Reconnect backoff of a thread's ends: from the first to the longest wait. */
#define RELAY_RECONNECT_FIRST_SECONDS 0.2
#define RELAY_RECONNECT_MAX_SECONDS 10.0
/* --once gives up on an end it cannot reach, or a pipeline that moves no row, after this long. */
#define RELAY_ONCE_CONNECT_BUDGET_SECONDS 10.0

/* ---- the relay's pipelines (relay/pipeline.c, relay/scheduler.c) ---------------- */

/* While rows came within the window, an empty claim waits at most this long before the next. */
#define PIPELINE_BUSY_POLL_MAX_MS 8
#define PIPELINE_BUSY_WINDOW_SECONDS 1.0
/* The pause after a turn whose rows the still connected broker deferred: first and longest. */
#define PIPELINE_DEFERRED_PAUSE_FIRST_SECONDS 0.05
#define PIPELINE_DEFERRED_PAUSE_MAX_SECONDS 2.0
/* The broker connection is serviced (heartbeats) at least this often when idle. */
#define PIPELINE_SINK_IDLE_EVERY_SECONDS 1.0

/* ---- the relay's maintenance (relay/maintenance.c; a list's tenants, scheduler.c) */

/* Expired leases are reaped this often; a reaped row is retried this soon. */
#define MAINTENANCE_REAP_EVERY_SECONDS 5.0
#define MAINTENANCE_REAP_RETRY_SECONDS 1.0
/* Rows waiting behind an ordering key that moved on are released this often. */
#define MAINTENANCE_SWEEP_EVERY_SECONDS 5.0
/* Cleanup of succeeded rows runs this often, batches back to back for at most the run time. */
#define MAINTENANCE_CLEANUP_EVERY_SECONDS 10.0
#define MAINTENANCE_CLEANUP_RUN_SECONDS 0.5
/* The backlog is sampled for /metrics this often. */
#define MAINTENANCE_SAMPLE_EVERY_SECONDS 15.0
/* A stream queue made while the relay runs is published this soon. */
#define MAINTENANCE_STREAM_CHECK_EVERY_SECONDS 2.0
/* The table's figures (size, dead tuples, vacuum horizon) are sampled this often. */
#define MAINTENANCE_TABLE_SAMPLE_EVERY_SECONDS 30.0
/* A phase whose database failed tries again this soon after the reconnect. */
#define MAINTENANCE_PHASE_RETRY_SECONDS 1.0

/* ---- the relay's list of databases (relay/scheduler.c) --------------------------- */

/* The longest slice a slot serves one database while others wait. */
#define SCHEDULER_SLICE_SECONDS 0.25
/* A stream slot of a relay's own database publishes this long a turn, then looks at its lease
 * renewals and its rows' wait again (relay/scheduler_serve.c). */
#define SCHEDULER_STREAM_TURN_SECONDS 1.0
/* The longest wait before an empty database is looked at again. */
#define SCHEDULER_IDLE_MAX_SECONDS 1.0
/*
 * An idle database the statistics watch covers, whose lease its owner's watch
 * keeps, is looked at at least this often though nothing wakes it (the watch
 * wakes it on a change of its rows or of the relays; this bounds what a missed
 * wake costs, and runs its retention cleanup).
 */
#define SCHEDULER_WATCHED_VISIT_SECONDS 900.0
/*
 * A database another relay holds, whose rows changed, is looked at again no
 * sooner than this after this relay's last look: the change may be that
 * relay giving it up (its list no longer names it) with no relay watching
 * the server changed, which would wake it at once.
 */
#define SCHEDULER_NOT_HELD_WAKE_SECONDS 5.0
/*
 * A database of a list whose outbox.job a session holds locked (a tenant's
 * LOCK TABLE, a long ALTER) fails a visit's statement after this, not after
 * STORE_STATEMENT_TIMEOUT_SECONDS, and is backed off: three tenants holding
 * locks held three slots of four for 10 s at a time (the others' p99 9.9 s).
 */
#define SCHEDULER_LOCK_TIMEOUT_MS 1000
/*
 * A database of a list never visited yet has its server probed first (relay/probe.h), all
 * at once: one that does not answer within this long is backed off before any slot spends
 * a connect_timeout on it (200 listed servers that never answered held the slots for
 * 132 s before a healthy database's first row).
 */
#define SCHEDULER_PROBE_TIMEOUT_MS 2000
/* At start, slots wait this long at most for the statistics watch's first look (and its probe). */
#define SCHEDULER_WATCH_FIRST_LOOK_SECONDS 1.0
/* A watched database whose slice published rows is looked at again after this (scheduler.c). */
#define SCHEDULER_WATCH_AFTER_ROWS_SECONDS 1.0
/* A relay that should hold a database another holds looks again after this, doubling. */
#define SCHEDULER_TAKEOVER_FIRST_SECONDS 0.5
/* A database is due but every connection of the budget is held: look again this soon. */
#define SCHEDULER_CONNECTION_WAIT_SECONDS 0.01
/* How often the list file's stamp is looked at. */
#define SCHEDULER_LIST_LOOK_SECONDS 1.0
/*
 * How often the statistics watch reads pg_stat_database (relay/scheduler_watch.c): while
 * every database is idle, and while one is served (a look then costs little beside the
 * work, and a quiet database's row waits less for it behind a busy one's).
 */
#define SCHEDULER_WATCH_SECONDS 0.1
#define SCHEDULER_WATCH_BUSY_SECONDS 0.025
/* A server the statistics watch has no connection to is tried again after this long. */
#define SCHEDULER_WATCH_RETRY_SECONDS 5.0
/* ... doubling while its connects fail (a server down, or one that never answers), up to this. */
#define SCHEDULER_WATCH_RETRY_MAX_SECONDS 60.0
/*
 * The statistics watch's connect (libpq's connect_timeout) and each of its looks get this
 * long: the watch looks at every server in turn, so a server that stalled holds the others'
 * wakes up for this once, then its connection is dropped and its databases are polled.
 */
#define SCHEDULER_WATCH_DEADLINE_SECONDS 2
/* A database that failed is tried again after a backoff from the first to the longest. */
#define SCHEDULER_RETRY_FIRST_SECONDS 1.0
#define SCHEDULER_RETRY_MAX_SECONDS 30.0
/*
 * A visit of a database counts its ready rows (relay/scheduler_sample.c) at most this often;
 * one that leaves a watched database resting probes whether a claim would take a row, and
 * counts when one would and the last count is SCHEDULER_SAMPLE_CLAIMABLE_SECONDS old. A
 * database this relay holds whose claimable rows saw no claim for SCHEDULER_STRANDED_SECONDS
 * is stranded (outbox_database_stranded).
 */
#define SCHEDULER_SAMPLE_SECONDS 15.0
#define SCHEDULER_SAMPLE_CLAIMABLE_SECONDS 1.0
#define SCHEDULER_STRANDED_SECONDS 30.0

/* ---- the relay's stream queues (relay/stream.c) ------------------------------------ */

/*
 * Lag is looked at this often; a partition lags when its oldest unpublished
 * row is older than --horizon-warning (STREAM_LAG_WARNING_SECONDS when that
 * is 0).
 */
#define STREAM_REPORT_SECONDS 5.0
#define STREAM_LAG_WARNING_SECONDS 60.0
/* Published rows are deleted this often. */
#define STREAM_CLEANUP_SECONDS 5.0
/* Idle waits: doubled from 1 ms to this while rows came in the window, else --poll-interval. */
#define STREAM_BUSY_POLL_MAX_MS 20
#define STREAM_BUSY_WINDOW_SECONDS 2.0
/* After a failed database call or connect, the thread waits this long before it tries again. */
#define STREAM_RETRY_MS 1000
/* Until a stream queue is found, the threads look at the runner's flag this often. */
#define STREAM_CHECK_WAIT_MS 10
/* A thread's sleep looks whether the relay is stopping this often. */
#define STREAM_SLEEP_SLICE_MS 50
/* After a broker outage deferred a batch, the partition waits this long. */
#define STREAM_DEFER_SECONDS 1.0

/* ---- the HTTP server (common/httpd.c, /metrics and the console), health and logs ----- */

/* A client has this long from its connect to send its request, and as long to read the answer. */
#define HTTP_REQUEST_TIMEOUT_SECONDS 5
/* How long a lingering connection discards the client's bytes. */
#define HTTP_LINGER_MS 1000
/* After accept() found no free descriptor, the pause before the next try (no busy loop). */
#define HTTP_ACCEPT_PAUSE_MS 100
/* The longest poll() of a server loop that watches a stop flag. */
#define HTTP_STOP_CHECK_MS 1000
/* --healthcheck: the whole exchange with the running relay, connect included. */
#define HEALTHCHECK_TIMEOUT_MS 5000
/* The relay is unhealthy when its loop has not turned for this long. */
#define METRICS_HEALTH_STALE_SECONDS 30.0
/* An end is down when no round trip with it succeeded within a window never shorter than this. */
#define METRICS_ROUND_TRIP_MIN_WINDOW_SECONDS 15.0
/* Default interval of log_event_limited(). */
#define LOG_RATE_LIMIT_DEFAULT_MS 10000
/* A cause_log logs the same text again after this long at the earliest. */
#define CAUSE_LOG_EVERY_SECONDS 60.0

/* ---- outboxctl ------------------------------------------------------------------------ */

/*
 * stream enable/disable: each try waits at most CTL_STREAM_LOCK_TRY_MS for
 * the trigger's lock, so producers queued behind it wait no longer; between
 * tries they go on for CTL_STREAM_LOCK_PAUSE_MS. --lock-wait (default
 * CTL_STREAM_LOCK_WAIT_DEFAULT_SECONDS) bounds the whole.
 */
#define CTL_STREAM_LOCK_TRY_MS 200
#define CTL_STREAM_LOCK_PAUSE_MS 800
#define CTL_STREAM_LOCK_WAIT_DEFAULT_SECONDS 60
/* A purge batch that found the cleanup lock taken tries again after this long. */
#define STORE_ADMIN_PURGE_LOCKED_WAIT_US 20000

/* The console: a request must arrive whole this long after its connection is accepted. */
#define CONSOLE_REQUEST_SECONDS 10
/* The console: an answer must be taken this long after its first byte is written. */
#define CONSOLE_ANSWER_SECONDS 10
/* The console's statements end after this long: a page waiting on a lock frees its worker. */
#define CONSOLE_STATEMENT_TIMEOUT_SECONDS 30
/* The console looks at the --databases file's stamp at most this often (as the relay does). */
#define CONSOLE_LIST_LOOK_SECONDS 1.0
/*
 * The Databases view looks at every database of the list on a connection of
 * its own: each connect is given this long (libpq's connect_timeout, 2 at
 * least), each statement that long, and no database is started on after the
 * view's deadline: one that is down costs its own entry, not the page.
 */
#define CONSOLE_PROBE_CONNECT_SECONDS 2
#define CONSOLE_PROBE_STATEMENT_SECONDS 2
#define CONSOLE_PROBE_DEADLINE_SECONDS 5

#endif
