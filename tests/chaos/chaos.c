/*
 * chaos.c - the fault-injection driver (see chaos.h).
 *
 * Threads: the main thread injects faults and starts/stops relays (relays
 * are spawned only from it, because a child's parent-death signal follows
 * the thread that forked it); producer threads commit transactions on their
 * own connections straight to PostgreSQL; a sampler thread reads the
 * long-lived relay's RSS and descriptor count from /proc. Producer threads
 * never call the cmocka-failing harness helpers.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "chaos.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "amqp_consumer.h"
#include "harness.h"
#include "outbox.h"
#include "proxy.h"
#include "redis_consumer.h"

#define RELAY_COUNT 3
#define PRODUCER_COUNT 4
#define ORDERING_KEYS 300
/* Partitions of the stream queue; every third ordering key and a third of the other rows go there. */
#define STREAM_PARTITIONS 4

/* Rows of the stream queue after their partition's cursor: not published yet. */
static const char SQL_STREAM_UNPUBLISHED[] =
    "SELECT count(*) FROM outbox.job AS j JOIN outbox.stream_cursor AS c"
    " ON c.queue = j.queue AND c.partition = j.stream_partition"
    " WHERE j.state = 'stream' AND (j.xid, j.job_id) > (c.cursor_xid, c.cursor_job_id)";
#define LEASE_SECONDS 5
#define DRAIN_TIMEOUT_MS 120000
#define SAMPLE_INTERVAL_MS 2000
#define MAX_SAMPLES 4096

/* Fault kinds; the names are the verdict's labels. */
enum fault_kind {
    FAULT_KILL,
    FAULT_STOP,
    FAULT_BROKER,
    FAULT_POSTGRES,
    FAULT_CUT_DATABASE,
    FAULT_CUT_BROKER,
    FAULT_STALL,
    FAULT_SLOW,
    FAULT_KINDS
};

static const char *const fault_names[FAULT_KINDS] = {
    "relay kill -9",        "relay SIGSTOP > lease", "broker stop/start", "postgres restart",
    "proxy cut (database)", "proxy cut (broker)",    "proxy stall",       "proxy slow",
};

/* Relative weights of the fault kinds, same order. */
static const int fault_weights[FAULT_KINDS] = {3, 2, 1, 1, 2, 2, 2, 2};

/* A growing array of job ids. */
struct id_list {
    int64_t *ids;
    size_t count;
    size_t capacity;
};

struct producer {
    struct chaos *chaos;
    int index;
    pthread_t thread;
    uint64_t rng;
    struct id_list committed;   /* new rows whose COMMIT returned OK */
    struct id_list rolled_back; /* new rows inside transactions rolled back */
    long duplicate_commits;     /* committed transactions that reused a key */
    long duplicate_mismatches;  /* a reused key that returned another job id */
    struct id_list forgotten;   /* --on-success delete: rows whose key a later enqueue reused
                                   after the row was gone (a new row then, by design) */
    long uncertain;             /* COMMIT failed: outcome unknown, settled from the table */
    long errors;                /* transactions broken by a fault */
    char keys[64][48];          /* recently committed idempotency keys and their ids */
    int64_t key_ids[64];
    const char *key_queues[64]; /* a key is reused in its row's queue (keys are per queue) */
    int key_count;
};

struct relay {
    pid_t pid;
    int incarnation;
    bool stopped;
    char log_path[512];
};

struct sample {
    double at;
    long rss_kb;
    long fds;
};

struct chaos {
    const struct chaos_options *options;
    uint64_t rng;
    char *database_url;
    PGconn *conn;
    chaos_proxy *database_proxy;
    chaos_proxy *broker_proxy;
    char name[64];          /* queue (and stream suffix) of this run */
    char stream_queue[72];  /* a stream queue (sql/009_stream.sql) beside it: name + ".s" */
    char relay_queues[144]; /* --queues: both */
    char stream_prefix[80]; /* redis */
    char stream[160];
    char stream_of_stream_queue[160];
    const char *broker_url; /* direct, for the consumer */
    char relay_broker_url[512];
    char relay_database_base[512];
    struct relay relays[RELAY_COUNT];
    struct producer producers[PRODUCER_COUNT];
    atomic_bool stop_producers;
    atomic_bool stop_sampler;
    atomic_int sampled_pid;
    pthread_t sampler;
    struct sample samples[MAX_SAMPLES];
    atomic_size_t sample_count;
    double started;
    long faults[FAULT_KINDS];
    enum fault_kind order[FAULT_KINDS]; /* the first round */
    int first_round;                    /* faults of the first round picked so far */
    long unexpected_exits;
};

static double
now_seconds(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void
sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};

    while (nanosleep(&ts, &ts) == -1 && errno == EINTR)
        ;
}

/* xorshift64*: small, seedable, the same schedule for the same seed. */
static uint64_t
next_random(uint64_t *state)
{
    uint64_t x = *state;

    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    return x * 2685821657736338717ULL;
}

/* A number in [low, high]. */
static long
random_between(uint64_t *state, long low, long high)
{
    return low + (long)(next_random(state) % (uint64_t)(high - low + 1));
}

static void
id_list_add(struct id_list *list, int64_t id)
{
    if (list->count == list->capacity) {
        list->capacity = list->capacity ? list->capacity * 2 : 1024;
        list->ids = realloc(list->ids, list->capacity * sizeof(*list->ids));
        if (list->ids == NULL)
            abort();
    }
    list->ids[list->count++] = id;
}

static void
id_list_clear(struct id_list *list)
{
    free(list->ids);
    memset(list, 0, sizeof(*list));
}

void
chaos_options_from_env(struct chaos_options *options, enum chaos_broker broker, int default_seconds)
{
    const char *value;

    memset(options, 0, sizeof(*options));
    options->broker = broker;
    value = getenv("OUTBOX_CHAOS_SECONDS");
    options->seconds = value && *value ? atoi(value) : default_seconds;
    if (options->seconds < 5)
        options->seconds = 5;
    value = getenv("OUTBOX_CHAOS_SEED");
    if (value && *value)
        options->seed = strtoull(value, NULL, 10);
    else
        options->seed =
            (uint64_t)time(NULL) * 1000003ULL ^ (uint64_t)getpid() ^ (uint64_t)broker * 7919ULL;
    if (options->seed == 0)
        options->seed = 1;
    value = getenv("OUTBOX_CHAOS_RATE");
    options->rate = value && *value ? atoi(value) : 150;
    if (options->rate < 1)
        options->rate = 1;
    value = getenv("OUTBOX_CHAOS_SOAK");
    options->soak = value && strcmp(value, "1") == 0;
}

/* ---- database helpers for the main thread -------------------------------- */

/* Server notices (e.g. the FATAL of a restart reaching an idle session) are expected here. */
static void
ignore_notice(void *arg, const char *message)
{
    (void)arg;
    (void)message;
}

/* Runs sql on the control connection, reconnecting across a server restart (30 s at most). */
static PGresult *
control_exec(struct chaos *c, const char *sql)
{
    for (int attempt = 0; attempt < 60; attempt++) {
        PGresult *result = PQexec(c->conn, sql);
        ExecStatusType status = PQresultStatus(result);

        if (status == PGRES_TUPLES_OK || status == PGRES_COMMAND_OK)
            return result;
        if (PQstatus(c->conn) == CONNECTION_OK) {
            fail_msg("chaos: query failed: %s: %s", sql, PQresultErrorMessage(result));
        }
        PQclear(result);
        sleep_ms(500);
        PQreset(c->conn);
    }
    fail_msg("chaos: database unreachable for 30 s");
    return NULL;
}

static long long
control_value(struct chaos *c, const char *sql)
{
    PGresult *result = control_exec(c, sql);
    long long value = PQntuples(result) > 0 && !PQgetisnull(result, 0, 0)
                          ? strtoll(PQgetvalue(result, 0, 0), NULL, 10)
                          : 0;

    PQclear(result);
    return value;
}

/*
 * The business table and the audit of every state transition of outbox.job;
 * a deleted row (--on-success delete) is logged as new state 'deleted',
 * with its ordering key.
 */
static const char SETUP_SQL[] =
    "CREATE TABLE chaos_order ("
    "  order_id bigserial PRIMARY KEY, job_id bigint NOT NULL, producer int NOT NULL,"
    "  amount numeric NOT NULL, created_at timestamptz NOT NULL DEFAULT clock_timestamp());"
    "CREATE TABLE chaos_audit ("
    "  seq bigserial PRIMARY KEY, job_id bigint NOT NULL, old_state text, new_state text,"
    "  old_worker text, new_worker text, old_attempts int, new_attempts int,"
    "  old_lease timestamptz, new_lease timestamptz, last_error text, ordering_key text,"
    "  actor text, at timestamptz NOT NULL);"
    "CREATE INDEX ON chaos_audit (job_id, seq);"
    "CREATE FUNCTION chaos_audit_job() RETURNS trigger LANGUAGE plpgsql"
    " SET search_path = public, pg_catalog AS $$"
    " BEGIN"
    "  IF TG_OP = 'DELETE' THEN"
    "   INSERT INTO chaos_audit (job_id, old_state, new_state, old_worker, old_attempts,"
    "     new_attempts, old_lease, last_error, ordering_key, actor, at)"
    "   VALUES (OLD.job_id, OLD.state, 'deleted', OLD.worker_id, OLD.attempts, OLD.attempts,"
    "     OLD.lease_until, OLD.last_error, OLD.ordering_key,"
    "     current_setting('application_name'), clock_timestamp());"
    "   RETURN OLD;"
    "  ELSIF TG_OP = 'INSERT' THEN"
    "   INSERT INTO chaos_audit (job_id, new_state, new_attempts, actor, at)"
    "   VALUES (NEW.job_id, NEW.state, NEW.attempts, current_setting('application_name'),"
    "           clock_timestamp());"
    "  ELSIF OLD.state IS DISTINCT FROM NEW.state OR OLD.attempts IS DISTINCT FROM NEW.attempts"
    "     OR OLD.worker_id IS DISTINCT FROM NEW.worker_id"
    "     OR OLD.lease_until IS DISTINCT FROM NEW.lease_until THEN"
    "   INSERT INTO chaos_audit (job_id, old_state, new_state, old_worker, new_worker,"
    "     old_attempts, new_attempts, old_lease, new_lease, last_error, actor, at)"
    "   VALUES (NEW.job_id, OLD.state, NEW.state, OLD.worker_id, NEW.worker_id, OLD.attempts,"
    "     NEW.attempts, OLD.lease_until, NEW.lease_until, NEW.last_error,"
    "     current_setting('application_name'), clock_timestamp());"
    "  END IF;"
    "  RETURN NEW;"
    " END $$;"
    "CREATE TRIGGER chaos_audit_job BEFORE INSERT OR UPDATE OR DELETE ON outbox.job"
    " FOR EACH ROW EXECUTE FUNCTION chaos_audit_job();";

/*
 * Fenced writes (extend, complete, fail, release, and the delete of
 * --on-success delete: every change of a running row except a reap) that
 * were not made by the session, worker and generation of the row's latest
 * claim, or were made after its lease ended. A reap is recognised by its
 * 'lease expired' error and must come after the lease ended.
 */
static const char AUDIT_VIOLATIONS_SQL[] =
    "WITH t AS (SELECT *, (last_error LIKE 'lease expired%%' AND new_state IN ('ready', 'dead')"
    "             AND new_attempts = old_attempts AND new_worker IS NULL) AS reap"
    "           FROM chaos_audit WHERE old_state = 'running')"
    " SELECT t.seq, t.job_id, t.old_state || '->' || t.new_state, t.actor, t.old_worker,"
    "        t.old_attempts, c.actor, c.new_worker, c.new_attempts,"
    "        round(extract(epoch FROM t.at - t.old_lease) * 1000), t.reap"
    " FROM t LEFT JOIN LATERAL (SELECT * FROM chaos_audit c WHERE c.job_id = t.job_id"
    "   AND c.seq < t.seq AND c.new_state = 'running' AND c.old_state IS DISTINCT FROM 'running'"
    "   ORDER BY c.seq DESC LIMIT 1) c ON true"
    " WHERE %s";

static const char AUDIT_FENCED_CONDITION[] =
    "NOT t.reap AND (c.seq IS NULL OR c.new_worker IS DISTINCT FROM t.old_worker"
    " OR c.new_attempts IS DISTINCT FROM t.old_attempts OR c.actor IS DISTINCT FROM t.actor"
    " OR t.at > t.old_lease)";
static const char AUDIT_REAP_CONDITION[] = "t.reap AND t.at < t.old_lease";

void
chaos_audit_install(PGconn *conn)
{
    harness_exec(conn, SETUP_SQL);
}

/* Counts the audit rows matching condition (see AUDIT_VIOLATIONS_SQL). */
static long long
audit_count(PGconn *conn, const char *condition)
{
    char sql[2048], count_sql[2200];

    snprintf(sql, sizeof(sql), AUDIT_VIOLATIONS_SQL, condition);
    snprintf(count_sql, sizeof(count_sql), "SELECT count(*) FROM (%s) v", sql);
    return harness_query_ll(conn, count_sql);
}

long long
chaos_audit_violations(PGconn *conn)
{
    return audit_count(conn, AUDIT_FENCED_CONDITION) + audit_count(conn, AUDIT_REAP_CONDITION);
}

/* ---- producers -------------------------------------------------------------- */

static PGconn *
producer_connect(struct producer *p)
{
    while (!atomic_load(&p->chaos->stop_producers)) {
        PGconn *conn = PQconnectdb(p->chaos->database_url);

        if (PQstatus(conn) == CONNECTION_OK) {
            PQsetNoticeProcessor(conn, ignore_notice, NULL);
            return conn;
        }
        PQfinish(conn);
        sleep_ms(200);
    }
    return NULL;
}

static bool
producer_command(PGconn *conn, const char *sql)
{
    PGresult *result = PQexec(conn, sql);
    bool ok =
        PQresultStatus(result) == PGRES_COMMAND_OK || PQresultStatus(result) == PGRES_TUPLES_OK;

    PQclear(result);
    return ok;
}

/* Remembers a committed idempotency key, for a later transaction to reuse. */
static void
producer_remember_key(struct producer *p, const char *key, const char *queue, int64_t id)
{
    int slot = p->key_count < 64 ? p->key_count++ : (int)(next_random(&p->rng) % 64);

    snprintf(p->keys[slot], sizeof(p->keys[slot]), "%s", key);
    p->key_ids[slot] = id;
    p->key_queues[slot] = queue;
}

/*
 * One business transaction: an order row and its outbox row. Returns false
 * when a fault broke the connection (the caller reconnects).
 */
/*
 * Picks the row's ordering key (half the rows have one) and queue: every
 * third key and a third of the rows without a key go to the stream queue,
 * so a key stays in one queue and its order is that queue's.
 */
static void
producer_pick_queue(struct producer *p, struct outbox_message *message, char *ordering,
                    size_t size)
{
    struct chaos *c = p->chaos;

    message->queue = c->name;
    if (random_between(&p->rng, 0, 1) == 0) {
        /* each producer owns its keys, so job_id order is commit order per key */
        long k = p->index +
                 PRODUCER_COUNT * random_between(&p->rng, 0, ORDERING_KEYS / PRODUCER_COUNT - 1);

        snprintf(ordering, size, "key-%03ld", k);
        message->ordering_key = ordering;
        if (k % 3 == 0)
            message->queue = c->stream_queue;
    } else if (random_between(&p->rng, 0, 2) == 0) {
        message->queue = c->stream_queue;
    }
}

static bool
producer_transaction(struct producer *p, PGconn *conn, long sequence)
{
    struct chaos *c = p->chaos;
    struct outbox_error err;
    struct outbox_message message = {0};
    char payload[128], key[48], ordering[32], sql[160];
    int64_t job_id = 0, expected = 0;
    long roll = random_between(&p->rng, 0, 99);
    bool rollback = roll < 10, reuse = false, ok;
    int reuse_slot = 0;
    PGresult *result;

    snprintf(payload, sizeof(payload), "{\"producer\": %d, \"sequence\": %ld}", p->index, sequence);
    message.payload_json = payload;
    message.max_attempts = 1000; /* faults must never make a row dead */
    producer_pick_queue(p, &message, ordering, sizeof(ordering));
    roll = random_between(&p->rng, 0, 99);
    if (roll < 8 && p->key_count > 0) {
        int slot = (int)(next_random(&p->rng) % (uint64_t)p->key_count);

        snprintf(key, sizeof(key), "%s", p->keys[slot]);
        expected = p->key_ids[slot];
        reuse_slot = slot;
        reuse = true;
        message.idempotency_key = key;
        if (strcmp(message.queue, p->key_queues[slot]) != 0) {
            message.queue = p->key_queues[slot];
            message.ordering_key = NULL; /* an ordering key stays in its own queue */
        }
    } else if (roll < 40) {
        snprintf(key, sizeof(key), "p%d-%ld", p->index, sequence);
        message.idempotency_key = key;
    }

    if (!producer_command(conn, "BEGIN"))
        return false;
    if (outbox_enqueue(conn, &message, &job_id, &err) == -1) {
        producer_command(conn, "ROLLBACK");
        return PQstatus(conn) == CONNECTION_OK;
    }
    /* the same key twice in one transaction: one row */
    if (message.idempotency_key != NULL && !reuse && random_between(&p->rng, 0, 19) == 0) {
        int64_t again = 0;

        if (outbox_enqueue(conn, &message, &again, &err) == -1) {
            producer_command(conn, "ROLLBACK");
            return PQstatus(conn) == CONNECTION_OK;
        }
        if (again != job_id)
            p->duplicate_mismatches++;
    }
    snprintf(sql, sizeof(sql),
             "INSERT INTO chaos_order (job_id, producer, amount) VALUES (%" PRId64 ", %d, %ld)",
             job_id, p->index, random_between(&p->rng, 1, 100000));
    if (!producer_command(conn, sql)) {
        producer_command(conn, "ROLLBACK");
        return PQstatus(conn) == CONNECTION_OK;
    }
    if (rollback) {
        ok = producer_command(conn, "ROLLBACK");
        if (ok && !reuse)
            id_list_add(&p->rolled_back, job_id);
        return ok;
    }
    result = PQexec(conn, "COMMIT");
    ok = PQresultStatus(result) == PGRES_COMMAND_OK;
    PQclear(result);
    if (!ok) {
        p->uncertain++;
        return false;
    }
    if (reuse) {
        p->duplicate_commits++;
        if (job_id != expected && c->options->delete_on_success) {
            /* the key went with its deleted row (the verdict checks it was deleted) */
            id_list_add(&p->forgotten, expected);
            id_list_add(&p->committed, job_id);
            p->key_ids[reuse_slot] = job_id;
        } else if (job_id != expected) {
            p->duplicate_mismatches++;
        }
    } else {
        id_list_add(&p->committed, job_id);
        if (message.idempotency_key != NULL)
            producer_remember_key(p, key, message.queue, job_id);
    }
    return true;
}

static void *
producer_main(void *arg)
{
    struct producer *p = arg;
    struct chaos *c = p->chaos;
    double interval = (double)PRODUCER_COUNT / c->options->rate;
    double next = now_seconds();
    PGconn *conn = producer_connect(p);
    long sequence = 0;

    while (conn != NULL && !atomic_load(&c->stop_producers)) {
        double wait = next - now_seconds();

        if (wait > 0)
            sleep_ms((long)(wait * 1000));
        next += interval;
        if (!producer_transaction(p, conn, sequence++)) {
            p->errors++;
            PQfinish(conn);
            conn = producer_connect(p);
            next = now_seconds();
        }
    }
    PQfinish(conn);
    return NULL;
}

/* ---- relays ------------------------------------------------------------------ */

static void
relay_start(struct chaos *c, int index)
{
    struct relay *r = &c->relays[index];
    char database_url[640], lease[16], *log;
    const char *argv[32];
    char binary[512];
    int n = 0;

    r->incarnation++;
    snprintf(binary, sizeof(binary), "%s/outbox-relay", harness_env("OUTBOX_BIN"));
    /* application_name names this relay incarnation in the audit table */
    snprintf(database_url, sizeof(database_url), "%s?application_name=chaos-r%d-i%d",
             c->relay_database_base, index, r->incarnation);
    snprintf(lease, sizeof(lease), "%d", LEASE_SECONDS);
    argv[n++] = binary;
    argv[n++] = "--database-url";
    argv[n++] = database_url;
    argv[n++] = "--broker";
    argv[n++] = c->relay_broker_url;
    argv[n++] = "--metrics-addr";
    argv[n++] = "off";
    argv[n++] = "--lease";
    argv[n++] = lease;
    argv[n++] = "--batch-size";
    argv[n++] = "50";
    argv[n++] = "--concurrency";
    argv[n++] = "2";
    argv[n++] = "--poll-interval";
    argv[n++] = "100ms";
    argv[n++] = "--retry-base";
    argv[n++] = "200ms";
    argv[n++] = "--retry-max";
    argv[n++] = "2s";
    argv[n++] = "--queues";
    argv[n++] = c->relay_queues;
    if (c->options->broker == CHAOS_REDIS) {
        argv[n++] = "--stream-prefix";
        argv[n++] = c->stream_prefix;
    }
    if (c->options->delete_on_success) {
        argv[n++] = "--on-success";
        argv[n++] = "delete";
    }
    argv[n] = NULL;
    if (r->log_path[0] == '\0') {
        char name[96];

        snprintf(name, sizeof(name), "chaos-%s-relay%d", c->name, index);
        log = harness_log_path(name);
        snprintf(r->log_path, sizeof(r->log_path), "%s", log);
        free(log);
    }
    r->pid = harness_spawn(argv, r->log_path);
    r->stopped = false;
}

/* Prints the last lines of a relay's log, for a verdict that needs them. */
static void
relay_log_tail(const struct relay *r, int lines)
{
    char command[700];

    snprintf(command, sizeof(command), "tail -n %d '%s' | sed 's/^/chaos:   | /'", lines,
             r->log_path);
    fflush(stdout);
    if (system(command) != 0)
        fprintf(stderr, "chaos: unable to show %s\n", r->log_path);
}

/* Restarts relays that exited without being told to; each one is a finding. */
static void
relay_check_alive(struct chaos *c)
{
    for (int i = 0; i < RELAY_COUNT; i++) {
        struct relay *r = &c->relays[i];
        int status;

        if (r->pid > 0 && waitpid(r->pid, &status, WNOHANG) == r->pid) {
            c->unexpected_exits++;
            printf("chaos: relay %d (pid %d) exited by itself: %s %d; log %s\n", i, (int)r->pid,
                   WIFEXITED(status) ? "status" : "signal",
                   WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status), r->log_path);
            relay_log_tail(r, 15);
            relay_start(c, i);
            if (i == 0)
                atomic_store(&c->sampled_pid, (int)c->relays[0].pid);
        }
    }
}

/* ---- resource sampling ------------------------------------------------------ */

static long
proc_rss_kb(int pid)
{
    char path[64], line[256];
    long rss = -1;
    FILE *f;

    snprintf(path, sizeof(path), "/proc/%d/status", pid);
    f = fopen(path, "r");
    if (f == NULL)
        return -1;
    while (fgets(line, sizeof(line), f) != NULL)
        if (strncmp(line, "VmRSS:", 6) == 0)
            rss = strtol(line + 6, NULL, 10);
    fclose(f);
    return rss;
}

static long
proc_fd_count(int pid)
{
    char path[64];
    struct dirent *entry;
    long count = 0;
    DIR *dir;

    snprintf(path, sizeof(path), "/proc/%d/fd", pid);
    dir = opendir(path);
    if (dir == NULL)
        return -1;
    while ((entry = readdir(dir)) != NULL)
        if (entry->d_name[0] != '.')
            count++;
    closedir(dir);
    return count;
}

static void *
sampler_main(void *arg)
{
    struct chaos *c = arg;

    while (!atomic_load(&c->stop_sampler)) {
        int pid = atomic_load(&c->sampled_pid);
        size_t n = atomic_load(&c->sample_count);
        long rss = proc_rss_kb(pid), fds = proc_fd_count(pid);

        if (rss > 0 && fds > 0 && n < MAX_SAMPLES) {
            c->samples[n] = (struct sample){now_seconds() - c->started, rss, fds};
            atomic_store(&c->sample_count, n + 1);
        }
        for (int i = 0; i < SAMPLE_INTERVAL_MS / 100 && !atomic_load(&c->stop_sampler); i++)
            sleep_ms(100);
    }
    return NULL;
}

static int
compare_long(const void *a, const void *b)
{
    long x = *(const long *)a, y = *(const long *)b;

    return (x > y) - (x < y);
}

/* The median of field (0 rss, 1 fds) over samples [from, to). */
static long
sample_median(const struct chaos *c, size_t from, size_t to, int field)
{
    long values[MAX_SAMPLES];
    size_t n = 0;

    for (size_t i = from; i < to; i++)
        values[n++] = field == 0 ? c->samples[i].rss_kb : c->samples[i].fds;
    if (n == 0)
        return 0;
    qsort(values, n, sizeof(*values), compare_long);
    return values[n / 2];
}

/*
 * Resource verdict of the relay that runs from start to end: after a
 * warm-up (the second fifth of the run), the least RSS of the last quarter
 * must stay within baseline + max(16 MiB, baseline / 2), and the least fd
 * count of the last quarter within baseline + 4. Least values, because a
 * steady leak raises the floor while a burst only raises peaks.
 */
static bool
resources_verdict(const struct chaos *c, bool judge)
{
    size_t n = atomic_load(&c->sample_count);
    long rss_base, fd_base, rss_floor = -1, fd_floor = -1, rss_max = 0, fd_max = 0;
    size_t tail = n - n / 4;
    bool ok = true;

    if (n < 8) {
        printf("  relay 0 resources:  too few samples (%zu)\n", n);
        return !judge;
    }
    rss_base = sample_median(c, n / 5, 2 * n / 5, 0);
    fd_base = sample_median(c, n / 5, 2 * n / 5, 1);
    for (size_t i = 0; i < n; i++) {
        if (c->samples[i].rss_kb > rss_max)
            rss_max = c->samples[i].rss_kb;
        if (c->samples[i].fds > fd_max)
            fd_max = c->samples[i].fds;
        if (i >= tail) {
            if (rss_floor < 0 || c->samples[i].rss_kb < rss_floor)
                rss_floor = c->samples[i].rss_kb;
            if (fd_floor < 0 || c->samples[i].fds < fd_floor)
                fd_floor = c->samples[i].fds;
        }
    }
    printf("  relay 0 rss (KiB):  first %ld, baseline %ld, max %ld, last-quarter floor %ld,"
           " last %ld (%zu samples every %d ms)\n",
           c->samples[0].rss_kb, rss_base, rss_max, rss_floor, c->samples[n - 1].rss_kb, n,
           SAMPLE_INTERVAL_MS);
    printf("  relay 0 open fds:   first %ld, baseline %ld, max %ld, last-quarter floor %ld,"
           " last %ld\n",
           c->samples[0].fds, fd_base, fd_max, fd_floor, c->samples[n - 1].fds);
    if (judge) {
        long rss_bound = rss_base + (rss_base / 2 > 16384 ? rss_base / 2 : 16384);

        if (rss_floor > rss_bound) {
            printf("  FAIL: relay memory grew steadily: floor %ld KiB > bound %ld KiB\n", rss_floor,
                   rss_bound);
            ok = false;
        }
        if (fd_floor > fd_base + 4) {
            printf("  FAIL: relay descriptors grew across reconnects: floor %ld > %ld\n", fd_floor,
                   fd_base + 4);
            ok = false;
        }
    }
    if (getenv("OUTBOX_CHAOS_SAMPLES") != NULL) {
        FILE *f = fopen(getenv("OUTBOX_CHAOS_SAMPLES"), "a");

        for (size_t i = 0; f != NULL && i < n; i++)
            fprintf(f, "%s %.1f %ld %ld\n", c->name, c->samples[i].at, c->samples[i].rss_kb,
                    c->samples[i].fds);
        if (f != NULL)
            fclose(f);
    }
    return ok;
}

/* ---- faults ---------------------------------------------------------------- */

/*
 * The next fault: first every kind once, in an order drawn from the seed
 * (broker restart last), so that even a short run covers them all; then by
 * weight.
 */
static enum fault_kind
pick_fault(struct chaos *c)
{
    int total = 0, roll;

    if (c->first_round == 0) {
        /* the broker restart last: RabbitMQ takes ~20 s to come back */
        for (int i = 0, n = 0; i < FAULT_KINDS; i++)
            if (i != FAULT_BROKER)
                c->order[n++] = (enum fault_kind)i;
        c->order[FAULT_KINDS - 1] = FAULT_BROKER;
        for (int i = FAULT_KINDS - 2; i > 0; i--) {
            int j = (int)random_between(&c->rng, 0, i);
            enum fault_kind swap = c->order[i];

            c->order[i] = c->order[j];
            c->order[j] = swap;
        }
    }
    if (c->first_round < FAULT_KINDS)
        return c->order[c->first_round++];

    for (int i = 0; i < FAULT_KINDS; i++)
        total += fault_weights[i];
    roll = (int)random_between(&c->rng, 0, total - 1);
    for (int i = 0; i < FAULT_KINDS; i++) {
        if (roll < fault_weights[i])
            return (enum fault_kind)i;
        roll -= fault_weights[i];
    }
    return FAULT_KILL;
}

static const char *
broker_service(const struct chaos *c)
{
    return c->options->broker == CHAOS_RABBITMQ ? "rabbitmq" : "redis";
}

static void
inject(struct chaos *c, enum fault_kind kind)
{
    double at = now_seconds() - c->started;
    chaos_proxy *proxy;
    long ms;
    int index, status;

    switch (kind) {
    case FAULT_KILL:
        /* relay 0 lives through the run: its memory and descriptors are sampled */
        index = (int)random_between(&c->rng, 1, RELAY_COUNT - 1);
        ms = random_between(&c->rng, 0, 1500);
        printf("chaos: %6.1fs kill -9 relay %d, restart after %ld ms\n", at, index, ms);
        kill(c->relays[index].pid, SIGKILL);
        waitpid(c->relays[index].pid, &status, 0);
        sleep_ms(ms);
        relay_start(c, index);
        break;
    case FAULT_STOP:
        index = (int)random_between(&c->rng, 0, RELAY_COUNT - 1);
        ms = random_between(&c->rng, LEASE_SECONDS * 1000 + 1000, LEASE_SECONDS * 1000 + 4000);
        printf("chaos: %6.1fs SIGSTOP relay %d for %ld ms (lease %d s)\n", at, index, ms,
               LEASE_SECONDS);
        kill(c->relays[index].pid, SIGSTOP);
        c->relays[index].stopped = true;
        sleep_ms(ms);
        kill(c->relays[index].pid, SIGCONT);
        c->relays[index].stopped = false;
        break;
    case FAULT_BROKER:
        ms = random_between(&c->rng, 500, 4000);
        printf("chaos: %6.1fs stop %s for %ld ms\n", at, broker_service(c), ms);
        if (harness_stack("stop-service", broker_service(c)) != 0)
            fail_msg("chaos: unable to stop %s", broker_service(c));
        sleep_ms(ms);
        if (harness_stack("start-service", broker_service(c)) != 0)
            fail_msg("chaos: unable to start %s again", broker_service(c));
        break;
    case FAULT_POSTGRES:
        printf("chaos: %6.1fs postgres fast restart\n", at);
        if (harness_stack("restart-service", "postgres") != 0)
            fail_msg("chaos: unable to restart postgres");
        break;
    case FAULT_CUT_DATABASE:
        printf("chaos: %6.1fs cut every relay connection to postgres\n", at);
        chaos_proxy_cut(c->database_proxy);
        break;
    case FAULT_CUT_BROKER:
        printf("chaos: %6.1fs cut every relay connection to %s\n", at, broker_service(c));
        chaos_proxy_cut(c->broker_proxy);
        break;
    case FAULT_STALL:
        proxy = random_between(&c->rng, 0, 1) ? c->database_proxy : c->broker_proxy;
        ms = random_between(&c->rng, 500, LEASE_SECONDS * 1000 + 3000);
        printf("chaos: %6.1fs stall relay traffic to %s for %ld ms\n", at,
               proxy == c->database_proxy ? "postgres" : broker_service(c), ms);
        chaos_proxy_stall(proxy);
        sleep_ms(ms);
        chaos_proxy_normal(proxy);
        break;
    case FAULT_SLOW:
        proxy = random_between(&c->rng, 0, 1) ? c->database_proxy : c->broker_proxy;
        ms = random_between(&c->rng, 2000, 5000);
        index = (int)random_between(&c->rng, 10, 80);
        printf("chaos: %6.1fs slow relay traffic to %s by %d ms per chunk for %ld ms\n", at,
               proxy == c->database_proxy ? "postgres" : broker_service(c), index, ms);
        chaos_proxy_slow(proxy, index);
        sleep_ms(ms);
        chaos_proxy_normal(proxy);
        break;
    default:
        break;
    }
    fflush(stdout);
    c->faults[kind]++;
}

/* ---- deliveries ------------------------------------------------------------ */

/* Every message of one AMQP queue, in delivery order, as job ids; the queue is deleted. */
static void
read_amqp_queue(struct chaos *c, const char *queue, struct id_list *delivered, long *foreign)
{
    struct queue_consumer_message messages[500];
    queue_consumer *mq = queue_consumer_connect(c->broker_url);
    size_t fetched;
    int empty = 0;

    assert_non_null(mq);
    while (empty < 2) {
        if (queue_consumer_fetch(mq, queue, messages, 500, 1000, &fetched) == -1)
            fail_msg("chaos: unable to read the queue: %s", queue_consumer_error(mq));
        empty = fetched == 0 ? empty + 1 : 0;
        for (size_t i = 0; i < fetched; i++) {
            if (messages[i].job_id < 0)
                (*foreign)++;
            else
                id_list_add(delivered, messages[i].job_id);
            queue_consumer_message_clear(&messages[i]);
        }
    }
    queue_consumer_delete_queue(mq, queue);
    queue_consumer_free(mq);
}

/* Every entry of one Redis stream, in order, as job ids. */
static void
read_redis_stream(redisContext *redis, const char *key, struct id_list *delivered, long *foreign)
{
    struct stream_consumer_stream stream;

    assert_int_equal(stream_consumer_read_stream(redis, key, &stream), 0);
    for (size_t i = 0; i < stream.count; i++) {
        if (stream.entries[i].job_id <= 0)
            (*foreign)++;
        else
            id_list_add(delivered, stream.entries[i].job_id);
    }
    stream_consumer_stream_clear(&stream);
}

/*
 * Every message on the broker, of the row-state queue then of the stream
 * queue, each in delivery order, as job ids (an ordering key lives in one
 * queue, so its order is kept).
 */
static void
read_deliveries(struct chaos *c, struct id_list *delivered, long *foreign)
{
    if (c->options->broker == CHAOS_RABBITMQ) {
        read_amqp_queue(c, c->name, delivered, foreign);
        read_amqp_queue(c, c->stream_queue, delivered, foreign);
    } else {
        redisContext *redis = stream_consumer_connect(c->broker_url);

        assert_non_null(redis);
        read_redis_stream(redis, c->stream, delivered, foreign);
        read_redis_stream(redis, c->stream_of_stream_queue, delivered, foreign);
        stream_consumer_delete_prefix(redis, c->stream_prefix);
        redisFree(redis);
    }
}

/* ---- verdict ---------------------------------------------------------------- */

struct verdict {
    bool ok;
};

static void
check(struct verdict *v, bool condition, const char *what)
{
    if (!condition) {
        printf("  FAIL: %s\n", what);
        v->ok = false;
    }
}

/* Prints up to 5 audit rows matching condition; their count. */
static long long
audit_violations(struct chaos *c, const char *condition, const char *label)
{
    char sql[2048];
    PGresult *result;
    long long count;

    snprintf(sql, sizeof(sql), AUDIT_VIOLATIONS_SQL, condition);
    result = control_exec(c, sql);
    count = PQntuples(result);
    for (int i = 0; i < PQntuples(result) && i < 5; i++)
        printf("  %s: audit seq %s job %s %s by session %s worker %s gen %s; latest claim by"
               " session %s worker %s gen %s; %s ms past lease end\n",
               label, PQgetvalue(result, i, 0), PQgetvalue(result, i, 1), PQgetvalue(result, i, 2),
               PQgetvalue(result, i, 3), PQgetvalue(result, i, 4), PQgetvalue(result, i, 5),
               PQgetvalue(result, i, 6), PQgetvalue(result, i, 7), PQgetvalue(result, i, 8),
               PQgetvalue(result, i, 9));
    PQclear(result);
    return count;
}

/* Why duplicated jobs were published again: how each earlier claim ended. */
static void
print_duplicate_causes(struct chaos *c, const struct id_list *duplicated)
{
    PGresult *result;
    char *array;
    size_t size = duplicated->count * 21 + 3, used = 0;
    const char *params[1];

    if (duplicated->count == 0)
        return;
    array = malloc(size);
    assert_non_null(array);
    used += (size_t)snprintf(array + used, size - used, "{");
    for (size_t i = 0; i < duplicated->count; i++)
        used += (size_t)snprintf(array + used, size - used, "%s%" PRId64, i ? "," : "",
                                 duplicated->ids[i]);
    snprintf(array + used, size - used, "}");
    params[0] = array;
    result = PQexecParams(
        c->conn,
        "SELECT cause, count(DISTINCT job_id) FROM ("
        " SELECT job_id, CASE"
        "   WHEN new_state = 'ready' AND new_attempts < old_attempts THEN 'claim released'"
        "   WHEN last_error LIKE 'lease expired%' THEN 'lease expired, row reaped'"
        "   ELSE 'publish failed: ' || left(coalesce(last_error, '?'), 70) END AS cause"
        " FROM chaos_audit WHERE job_id = ANY($1::bigint[]) AND old_state = 'running'"
        "   AND new_state IN ('ready', 'dead')"
        " UNION ALL"
        " SELECT job_id, 'claimed once (a broker-side duplicate)' FROM chaos_audit"
        "  WHERE job_id = ANY($1::bigint[]) GROUP BY job_id"
        "  HAVING count(*) FILTER (WHERE new_state = 'running' AND old_state = 'ready') = 1"
        ") causes GROUP BY 1 ORDER BY 2 DESC, 1",
        1, NULL, params, NULL, NULL, 0);
    if (PQresultStatus(result) == PGRES_TUPLES_OK) {
        for (int i = 0; i < PQntuples(result); i++)
            printf("      %6s jobs: %s\n", PQgetvalue(result, i, 1), PQgetvalue(result, i, 0));
        printf("      (a job claimed more than twice can count under more than one cause)\n");
    } else
        printf("      (causes unavailable: %s)\n", PQresultErrorMessage(result));
    PQclear(result);
    free(array);
}

static bool
verdict(struct chaos *c, const struct id_list *delivered, long foreign, double seconds)
{
    struct verdict v = {true};
    PGresult *rows;
    int64_t max_id = 0;
    int *copies, *key_of, *key_last;
    char *state_of; /* 0 none, 1 committed row */
    long committed_known = 0, rolled_back = 0, uncertain = 0, duplicate_commits = 0, mismatches = 0,
         producer_errors = 0, lost_known = 0, rolled_back_present = 0;
    long missing = 0, duplicates = 0, duplicated_jobs = 0, rolled_back_delivered = 0,
         not_committed = 0, out_of_order = 0, keyed = 0, not_succeeded;
    long long rows_total, orphans, audit_rows, completions, fenced_bad, reap_bad, dead, reclaimed;
    long long deleted, kept_succeeded = 0, forgotten = 0, forgotten_bad = 0, stream_rows;
    struct id_list duplicated = {0};

    /* the committed rows: those left, and those deleted at completion */
    rows = control_exec(c, "SELECT job_id, ordering_key FROM outbox.job UNION ALL"
                           " SELECT job_id, ordering_key FROM chaos_audit"
                           " WHERE new_state = 'deleted' ORDER BY job_id");
    rows_total = PQntuples(rows);
    if (rows_total > 0)
        max_id = strtoll(PQgetvalue(rows, (int)rows_total - 1, 0), NULL, 10);
    for (int i = 0; i < PRODUCER_COUNT; i++)
        for (size_t j = 0; j < c->producers[i].rolled_back.count; j++)
            if (c->producers[i].rolled_back.ids[j] > max_id)
                max_id = c->producers[i].rolled_back.ids[j];
    for (size_t i = 0; i < delivered->count; i++)
        if (delivered->ids[i] > max_id)
            max_id = delivered->ids[i];
    copies = calloc((size_t)max_id + 1, sizeof(*copies));
    key_of = calloc((size_t)max_id + 1, sizeof(*key_of));
    state_of = calloc((size_t)max_id + 1, 1);
    key_last = calloc(ORDERING_KEYS, sizeof(*key_last));
    assert_true(copies && key_of && state_of && key_last);
    for (int i = 0; i < rows_total; i++) {
        int64_t id = strtoll(PQgetvalue(rows, i, 0), NULL, 10);

        state_of[id] = 1;
        key_of[id] = PQgetisnull(rows, i, 1) ? -1 : atoi(PQgetvalue(rows, i, 1) + 4);
        if (key_of[id] >= 0)
            keyed++;
    }
    PQclear(rows);

    for (int i = 0; i < PRODUCER_COUNT; i++) {
        struct producer *p = &c->producers[i];

        committed_known += (long)p->committed.count;
        forgotten += (long long)p->forgotten.count;
        for (size_t j = 0; j < p->forgotten.count; j++) {
            char sql[160];

            snprintf(sql, sizeof(sql),
                     "SELECT count(*) FROM chaos_audit WHERE job_id = %" PRId64
                     " AND old_state = 'running' AND new_state = 'deleted'",
                     p->forgotten.ids[j]);
            if (control_value(c, sql) != 1)
                forgotten_bad++;
        }
        rolled_back += (long)p->rolled_back.count;
        uncertain += p->uncertain;
        duplicate_commits += p->duplicate_commits;
        mismatches += p->duplicate_mismatches;
        producer_errors += p->errors;
        for (size_t j = 0; j < p->committed.count; j++)
            if (!state_of[p->committed.ids[j]])
                lost_known++;
        for (size_t j = 0; j < p->rolled_back.count; j++)
            if (state_of[p->rolled_back.ids[j]])
                rolled_back_present++;
    }
    for (int i = 0; i < PRODUCER_COUNT; i++)
        for (size_t j = 0; j < c->producers[i].rolled_back.count; j++)
            state_of[c->producers[i].rolled_back.ids[j]] = 2;

    for (size_t i = 0; i < delivered->count; i++) {
        int64_t id = delivered->ids[i];

        if (id <= 0 || state_of[id] != 1) {
            if (id > 0 && state_of[id] == 2)
                rolled_back_delivered++;
            else
                not_committed++;
            continue;
        }
        if (copies[id]++ > 0) {
            duplicates++;
            if (copies[id] == 2) {
                duplicated_jobs++;
                id_list_add(&duplicated, id);
            }
            continue;
        }
        if (key_of[id] >= 0 && key_of[id] < ORDERING_KEYS) {
            if (key_last[key_of[id]] > id) {
                if (out_of_order < 5)
                    printf("  out of order: key-%03d job %" PRId64 " first delivered after job"
                           " %d\n",
                           key_of[id], id, key_last[key_of[id]]);
                out_of_order++;
            } else {
                key_last[key_of[id]] = (int)id;
            }
        }
    }
    for (int64_t id = 1; id <= max_id; id++)
        if (state_of[id] == 1 && copies[id] == 0) {
            if (missing < 5)
                printf("  missing: job %" PRId64 " was committed and never delivered\n", id);
            missing++;
        }

    not_succeeded = (long)control_value(c, "SELECT count(*) FROM outbox.job"
                                           " WHERE state NOT IN ('succeeded', 'stream')");
    not_succeeded += (long)control_value(c, SQL_STREAM_UNPUBLISHED);
    stream_rows = control_value(c, "SELECT count(*) FROM outbox.job WHERE state = 'stream'");
    dead = control_value(c, "SELECT count(*) FROM outbox.job WHERE state = 'dead'");
    deleted = control_value(c, "SELECT count(*) FROM chaos_audit WHERE new_state = 'deleted'");
    if (c->options->delete_on_success)
        kept_succeeded = control_value(c, "SELECT count(*) FROM outbox.job"
                                          " WHERE state = 'succeeded'");
    orphans = control_value(c, "SELECT (SELECT count(*) FROM outbox.job j WHERE NOT EXISTS"
                               "  (SELECT 1 FROM chaos_order o WHERE o.job_id = j.job_id))"
                               " + (SELECT count(*) FROM chaos_order o WHERE NOT EXISTS"
                               "  (SELECT 1 FROM outbox.job j WHERE j.job_id = o.job_id)"
                               "  AND NOT EXISTS (SELECT 1 FROM chaos_audit a"
                               "   WHERE a.job_id = o.job_id AND a.new_state = 'deleted'))");
    audit_rows = control_value(c, "SELECT count(*) FROM chaos_audit");
    reclaimed = control_value(c, "SELECT count(*) FROM (SELECT job_id FROM chaos_audit"
                                 " WHERE old_state = 'ready' AND new_state = 'running'"
                                 " GROUP BY job_id HAVING count(*) > 1) j");
    completions = control_value(c, "SELECT count(*) FROM chaos_audit WHERE old_state = 'running'"
                                   " AND new_state IN ('succeeded', 'deleted')");

    printf("\nchaos verdict: %s%s, seed %" PRIu64 " (replay: OUTBOX_CHAOS_SEED=%" PRIu64
           "), %d s of faults, %.0f s in all\n",
           broker_service(c), c->options->delete_on_success ? " --on-success delete" : "",
           c->options->seed, c->options->seed, c->options->seconds, seconds);
    printf("  rows committed:     %lld (acknowledged commits %ld, commits with unknown outcome"
           " %ld)\n",
           rows_total, committed_known, uncertain);
    printf("  rolled back:        %ld rows (none may exist or be delivered)\n", rolled_back);
    printf("  duplicate keys:     %ld committed transactions reused a key, %ld got another id\n",
           duplicate_commits, mismatches);
    printf("  producer retries:   %ld transactions broken by faults\n", producer_errors);
    printf("  rows final state:   %lld succeeded (%lld of them deleted, %lld published by the"
           " cursors of stream queue %s), %lld dead, %lld not finished\n",
           rows_total - not_succeeded, deleted, stream_rows, c->stream_queue, dead,
           (long long)not_succeeded - dead);
    if (c->options->delete_on_success)
        printf("  on success delete:  %lld succeeded rows kept, %lld reused keys found their row"
               " gone (%lld of those rows never deleted by a completion)\n",
               kept_succeeded, forgotten, forgotten_bad);
    printf("  delivered:          %zu messages, %lld distinct jobs, %ld missing, %ld"
           " duplicates (%ld jobs)\n",
           delivered->count,
           (long long)(delivered->count - (size_t)duplicates - (size_t)rolled_back_delivered -
                       (size_t)not_committed),
           missing, duplicates, duplicated_jobs);
    print_duplicate_causes(c, &duplicated);
    printf("  published again:    %lld jobs were claimed more than once (%s)\n", reclaimed,
           c->options->broker == CHAOS_REDIS ? "the stream's dedup kept one entry each"
                                             : "each may be a duplicate");
    printf("  not committed:      %ld rolled-back rows delivered, %ld other unknown messages\n",
           rolled_back_delivered, not_committed + foreign);
    printf("  ordering:           %ld keyed rows over %d keys, %ld first deliveries out of"
           " order\n",
           keyed, ORDERING_KEYS, out_of_order);
    fenced_bad = audit_violations(c, AUDIT_FENCED_CONDITION, "fence violation");
    reap_bad = audit_violations(c, AUDIT_REAP_CONDITION, "early reap");
    printf("  audit:              %lld transitions, %lld completions; %lld fenced writes not"
           " by the current owner in its lease, %lld reaps before lease end\n",
           audit_rows, completions, fenced_bad, reap_bad);
    printf("  business rows:      %lld outbox rows without their order or orders without"
           " their row\n",
           orphans);
    printf("  faults:            ");
    for (int i = 0; i < FAULT_KINDS; i++)
        printf(" %s %ld%s", fault_names[i], c->faults[i], i + 1 < FAULT_KINDS ? "," : "\n");
    printf("  relays:             %ld unexpected exits\n", c->unexpected_exits);

    check(&v, lost_known == 0, "acknowledged commits missing from outbox.job");
    check(&v, rolled_back_present == 0, "rolled-back rows present in outbox.job");
    check(&v, mismatches == 0, "a reused idempotency key returned another job id");
    check(&v, forgotten_bad == 0, "a reused key returned another job id while its row existed");
    check(&v, kept_succeeded == 0, "--on-success delete kept succeeded rows");
    check(&v, not_succeeded == 0, "rows not succeeded after the drain");
    check(&v, missing == 0, "committed rows never delivered");
    check(&v, rolled_back_delivered == 0 && not_committed + foreign == 0,
          "messages of rows never committed");
    if (c->options->broker == CHAOS_REDIS)
        check(&v, duplicates == 0, "jobs appended to the stream more than once");
    check(&v, out_of_order == 0, "ordering keys delivered out of job_id order");
    check(&v, fenced_bad == 0, "fenced writes by a worker that did not own the row");
    check(&v, reap_bad == 0, "leases reaped before they ended");
    check(&v, orphans == 0, "outbox rows and business rows disagree");
    check(&v, c->unexpected_exits == 0, "relays exited without being told to");
    check(&v, rows_total > 0 && completions > 0, "nothing was produced");
    check(&v, stream_rows > 0, "no row went through the stream queue");
    if (!resources_verdict(c, c->options->soak))
        v.ok = false;
    printf("  VERDICT: %s\n\n", v.ok ? "PASS" : "FAIL");
    fflush(stdout);

    id_list_clear(&duplicated);
    free(copies);
    free(key_of);
    free(state_of);
    free(key_last);
    return v.ok;
}

/* ---- the run ------------------------------------------------------------------ */

/* The URL of the test database with host and port replaced by the proxy's. */
static void
setup_urls(struct chaos *c)
{
    const char *database = strrchr(c->database_url, '/');
    const char *broker_port = harness_env(
        c->options->broker == CHAOS_RABBITMQ ? "OUTBOX_TEST_AMQP_PORT" : "OUTBOX_TEST_REDIS_PORT");
    const char *at;

    assert_non_null(database);
    c->database_proxy = chaos_proxy_start(atoi(harness_env("OUTBOX_TEST_PG_PORT")), 0);
    c->broker_proxy = chaos_proxy_start(atoi(broker_port), 0);
    assert_non_null(c->database_proxy);
    assert_non_null(c->broker_proxy);
    snprintf(c->relay_database_base, sizeof(c->relay_database_base),
             "postgresql://postgres@127.0.0.1:%d%s", chaos_proxy_port(c->database_proxy), database);
    c->broker_url = harness_env(c->options->broker == CHAOS_RABBITMQ ? "OUTBOX_TEST_AMQP_URL"
                                                                     : "OUTBOX_TEST_REDIS_URL");
    at = strrchr(c->broker_url, '@');
    assert_non_null(at);
    /* scheme://credentials@127.0.0.1:<proxy>/rest */
    snprintf(c->relay_broker_url, sizeof(c->relay_broker_url), "%.*s@127.0.0.1:%d%s",
             (int)(at - c->broker_url), c->broker_url, chaos_proxy_port(c->broker_proxy),
             strchr(at, '/'));
}

/* Makes the stream queue a stream; with RabbitMQ declares both queues. */
static void
setup_queues(struct chaos *c)
{
    char sql[160];

    snprintf(sql, sizeof(sql), "SELECT outbox.stream_enable('%s', %d)", c->stream_queue,
             STREAM_PARTITIONS);
    harness_exec(c->conn, sql);
    if (c->options->broker == CHAOS_RABBITMQ) {
        queue_consumer *mq = queue_consumer_connect(c->broker_url);

        assert_non_null(mq);
        assert_int_equal(queue_consumer_declare_queue(mq, c->name), 0);
        assert_int_equal(queue_consumer_declare_queue(mq, c->stream_queue), 0);
        queue_consumer_free(mq);
    }
}

bool
chaos_run(const struct chaos_options *options)
{
    struct chaos *c = calloc(1, sizeof(*c));
    struct id_list delivered = {0};
    long foreign = 0;
    double deadline, drain_start;
    long long left;
    bool ok;

    assert_non_null(c);
    c->options = options;
    c->rng = options->seed;
    snprintf(c->name, sizeof(c->name), "chaos-%d-%s-%ld", (int)getpid(), broker_service(c),
             (long)time(NULL) % 100000);
    snprintf(c->stream_prefix, sizeof(c->stream_prefix), "%s:", c->name);
    snprintf(c->stream, sizeof(c->stream), "%s%s", c->stream_prefix, c->name);
    snprintf(c->stream_queue, sizeof(c->stream_queue), "%s.s", c->name);
    snprintf(c->relay_queues, sizeof(c->relay_queues), "%s,%s", c->name, c->stream_queue);
    snprintf(c->stream_of_stream_queue, sizeof(c->stream_of_stream_queue), "%s%s",
             c->stream_prefix, c->stream_queue);
    printf("chaos: %s%s, seed %" PRIu64 " (replay with OUTBOX_CHAOS_SEED=%" PRIu64 "), %d s,"
           " %d transactions/s, %d relays, lease %d s\n",
           broker_service(c), options->delete_on_success ? " --on-success delete" : "",
           options->seed, options->seed, options->seconds, options->rate, RELAY_COUNT,
           LEASE_SECONDS);
    fflush(stdout);

    c->database_url = harness_database_new();
    c->conn = harness_connect(c->database_url);
    PQsetNoticeProcessor(c->conn, ignore_notice, NULL);
    harness_exec(c->conn, SETUP_SQL);
    setup_urls(c);
    setup_queues(c);

    c->started = now_seconds();
    for (int i = 0; i < RELAY_COUNT; i++)
        relay_start(c, i);
    atomic_store(&c->sampled_pid, (int)c->relays[0].pid);
    assert_int_equal(pthread_create(&c->sampler, NULL, sampler_main, c), 0);
    for (int i = 0; i < PRODUCER_COUNT; i++) {
        c->producers[i].chaos = c;
        c->producers[i].index = i;
        c->producers[i].rng = options->seed ^ (0x9E3779B97F4A7C15ULL * (uint64_t)(i + 1));
        assert_int_equal(
            pthread_create(&c->producers[i].thread, NULL, producer_main, &c->producers[i]), 0);
    }

    deadline = c->started + options->seconds;
    while (now_seconds() < deadline) {
        sleep_ms(random_between(&c->rng, 1000, 3000));
        relay_check_alive(c);
        if (now_seconds() >= deadline)
            break;
        inject(c, pick_fault(c));
        relay_check_alive(c);
    }

    /* quiet: producers stop, every relay runs, the relays drain the table */
    atomic_store(&c->stop_producers, true);
    for (int i = 0; i < PRODUCER_COUNT; i++)
        pthread_join(c->producers[i].thread, NULL);
    chaos_proxy_normal(c->database_proxy);
    chaos_proxy_normal(c->broker_proxy);
    drain_start = now_seconds();
    do {
        relay_check_alive(c);
        left = control_value(c, "SELECT count(*) FROM outbox.job"
                                " WHERE state IN ('ready', 'running')") +
               control_value(c, SQL_STREAM_UNPUBLISHED);
        if (left > 0)
            sleep_ms(500);
    } while (left > 0 && now_seconds() - drain_start < DRAIN_TIMEOUT_MS / 1000.0);
    printf("chaos: drained in %.1f s (%lld rows left)\n", now_seconds() - drain_start, left);

    atomic_store(&c->stop_sampler, true);
    pthread_join(c->sampler, NULL);
    for (int i = 0; i < RELAY_COUNT; i++)
        kill(c->relays[i].pid, SIGTERM);
    for (int i = 0; i < RELAY_COUNT; i++) {
        int status = harness_wait_exit(c->relays[i].pid, 20000);

        if (status != 0) {
            printf("chaos: relay %d stopped with status %d on SIGTERM; log %s\n", i, status,
                   c->relays[i].log_path);
            relay_log_tail(&c->relays[i], 15);
            c->unexpected_exits++;
        }
    }

    read_deliveries(c, &delivered, &foreign);
    ok = verdict(c, &delivered, foreign, now_seconds() - c->started);
    if (!ok)
        for (int i = 0; i < RELAY_COUNT; i++)
            printf("chaos: relay %d log: %s\n", i, c->relays[i].log_path);

    id_list_clear(&delivered);
    for (int i = 0; i < PRODUCER_COUNT; i++) {
        id_list_clear(&c->producers[i].committed);
        id_list_clear(&c->producers[i].rolled_back);
        id_list_clear(&c->producers[i].forgotten);
    }
    chaos_proxy_free(c->database_proxy);
    chaos_proxy_free(c->broker_proxy);
    PQfinish(c->conn);
    if (ok)
        harness_database_drop(c->database_url);
    else
        free(c->database_url); /* kept for a post-mortem */
    free(c);
    return ok;
}
