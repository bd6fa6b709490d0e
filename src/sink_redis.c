/*
 * sink_redis.c - the Redis Streams sink.
 *
 * Every message becomes one stream entry, exactly
 *
 *   XADD <stream_prefix><queue> [MAXLEN ~ N] * job_id <id> queue <queue>
 *        payload <json> headers <json> attempt <n>
 *
 * and is appended at most once per job per stream within the dedup window.
 * The check and the append are one atomic step in Redis: APPEND_SCRIPT below
 * is loaded with SCRIPT LOAD on connect and called with EVALSHA (EVAL with
 * the script text when the server answers NOSCRIPT, e.g. after SCRIPT FLUSH
 * or a failover; EVAL also caches it again). A job whose dedup record exists
 * is answered with the entry id recorded earlier and counts as accepted, so a
 * relay that died after the append and before marking its row never appends
 * the row a second time when the row is claimed again.
 *
 * Dedup key layout: "<stream>:outbox-dedup:<job_id>", a plain string whose
 * value is the entry id ("1764474000000-0"), written with PX = the window
 * (24 h when the option is 0), so Redis expires it by itself and there is
 * nothing to trim, and each record is independent of every other (no shared
 * set to scan or trim inside the script). Memory, measured on Redis 7.0
 * (jemalloc): MEMORY USAGE of one record of stream "orders" is 104 bytes, and
 * with the main and expires dictionaries 100 000 records raise used_memory
 * by 16.5 MB: about 165 bytes per job, so the cost is rate x window x 165 B
 * (1 000 jobs/s over the default 24 h window: ~14 GB). The window needs only
 * to outlast the time a row can stay appended but not marked (lease plus
 * retries), so busy deployments should shorten it. The stream entries cost
 * what their payloads cost, bounded by MAXLEN ~ when set.
 *
 * A batch is pipelined: commands are appended with redisAppendCommandArgv and
 * their replies read in order, with at most PIPELINE_WINDOW commands in
 * flight so the output buffer stays bounded for huge batches. An error reply
 * fails only its message. A broken connection or a timeout fails every
 * message still without a reply, frees the context and leaves the sink
 * disconnected; the messages of such a batch that Redis did append are
 * answered from their dedup records when published again.
 *
 * This sink talks to one Redis server (no cluster: the stream and its dedup
 * keys would need one hash slot). Writing to a closed socket raises SIGPIPE:
 * the process must ignore it, as the relay does.
 */
#include "sink_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#include <hiredis/hiredis.h>

#include "error.h"

#define DEFAULT_DEDUP_WINDOW_MS (24LL * 60 * 60 * 1000)
#define PIPELINE_WINDOW 4096
#define IDLE_PING_MS 1000 /* ping when idle this long */
#define DEDUP_INFIX ":outbox-dedup:"

/*
 * KEYS[1] stream, KEYS[2] dedup record; ARGV[1] window ms, ARGV[2] maxlen
 * ("0" for none), ARGV[3..7] job_id, queue, payload, headers, attempt.
 * Returns {entry id, 1} after an append, {earlier entry id, 0} for a
 * duplicate. Nothing is written before XADD, so an XADD error (WRONGTYPE,
 * OOM) leaves no dedup record behind.
 */
static const char APPEND_SCRIPT[] =
    "local existing = redis.call('GET', KEYS[2])\n"
    "if existing then return {existing, 0} end\n"
    "local id\n"
    "if ARGV[2] ~= '0' then\n"
    "  id = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[2], '*', 'job_id', ARGV[3],\n"
    "                  'queue', ARGV[4], 'payload', ARGV[5], 'headers', ARGV[6],\n"
    "                  'attempt', ARGV[7])\n"
    "else\n"
    "  id = redis.call('XADD', KEYS[1], '*', 'job_id', ARGV[3], 'queue', ARGV[4],\n"
    "                  'payload', ARGV[5], 'headers', ARGV[6], 'attempt', ARGV[7])\n"
    "end\n"
    "redis.call('SET', KEYS[2], id, 'PX', ARGV[1])\n"
    "return {id, 1}\n";

/* How a pipeline pass calls the script. */
enum script_call {
    CALL_EVALSHA, /* by the SHA1 loaded on connect */
    CALL_EVAL,    /* with the script text, after NOSCRIPT */
};

struct redis_sink {
    redisContext *context; /* NULL while disconnected */
    char sha[41];          /* SHA1 of APPEND_SCRIPT, from SCRIPT LOAD */
    char window_ms[24];    /* ARGV[1] */
    char maxlen[24];       /* ARGV[2] */
    char *keys;            /* scratch: stream key, then dedup key */
    size_t keys_capacity;
    long long last_used_ms; /* monotonic time of the last reply */
};

/* Monotonic milliseconds. */
static long long
now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static struct timeval
timeval_from_ms(int ms)
{
    struct timeval tv;

    tv.tv_sec = ms / 1000;
    tv.tv_usec = (ms % 1000) * 1000;
    return tv;
}

/*
 * Copies a Redis error text for a message: the first line, without the
 * " script: <sha>, on @user_script:N." tail that Redis 7 adds to errors
 * raised inside a script, and without a trailing period.
 */
static void
copy_redis_error(char *out, size_t size, const char *text, size_t len)
{
    const char *tail = strstr(text, " script: ");
    size_t n = strcspn(text, "\r\n");

    if (n > len)
        n = len;
    if (tail != NULL && (size_t)(tail - text) < n)
        n = (size_t)(tail - text);
    while (n > 0 && (text[n - 1] == '.' || text[n - 1] == ' '))
        n--;
    if (n >= size)
        n = size - 1;
    memcpy(out, text, n);
    out[n] = '\0';
}

/* Frees the context and marks the sink disconnected. */
static void
drop_connection(sink *s)
{
    struct redis_sink *r = s->impl;

    if (r->context != NULL)
        redisFree(r->context);
    r->context = NULL;
    s->connected = false;
}

/*
 * Fills err after an I/O failure on the context (saved_errno is errno right
 * after the failing call): a read or write timeout is OUTBOX_ERR_TIMEOUT,
 * anything else OUTBOX_ERR_CONNECTION. Drops the connection; returns -1.
 */
static int
fail_connection(sink *s, int saved_errno, const char *doing, struct outbox_error *err)
{
    struct redis_sink *r = s->impl;
    bool timed_out =
        r->context->err == REDIS_ERR_IO && (saved_errno == EAGAIN || saved_errno == EWOULDBLOCK ||
                                            saved_errno == ETIMEDOUT || saved_errno == EINPROGRESS);
    char reason[128];

    copy_redis_error(reason, sizeof(reason), r->context->errstr, strlen(r->context->errstr));
    if (timed_out)
        outbox_error_set(err, OUTBOX_ERR_TIMEOUT, "redis at %s did not answer %s within %d ms",
                         sink_display_url(s), doing, s->options.io_timeout_ms);
    else
        outbox_error_set(err, OUTBOX_ERR_CONNECTION, "lost the redis connection to %s %s: %s",
                         sink_display_url(s), doing, reason);
    drop_connection(s);
    return -1;
}

static int
redis_init(sink *s, struct outbox_error *err)
{
    struct redis_sink *r = calloc(1, sizeof(*r));
    long long window = s->options.dedup_window_ms > 0 ? (long long)s->options.dedup_window_ms
                                                      : DEFAULT_DEDUP_WINDOW_MS;

    if (r == NULL)
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    if (s->options.stream_maxlen < 0) {
        free(r);
        return outbox_error_set(err, OUTBOX_ERR_CONFIG, "stream max length must not be negative");
    }
    snprintf(r->window_ms, sizeof(r->window_ms), "%lld", window);
    snprintf(r->maxlen, sizeof(r->maxlen), "%" PRId64, s->options.stream_maxlen);
    s->impl = r;
    return 0;
}

/*
 * True when an error reply during connect is worth retrying later (the
 * server is starting, busy, or a replica lost its primary); everything else
 * (credentials, db out of range, missing permissions) is configuration.
 */
static bool
connect_error_is_transient(const char *text)
{
    static const char *const transient[] = {"LOADING", "BUSY", "MASTERDOWN", "TRYAGAIN"};

    for (size_t i = 0; i < sizeof(transient) / sizeof(transient[0]); i++)
        if (strncmp(text, transient[i], strlen(transient[i])) == 0)
            return true;
    return false;
}

/*
 * Runs one setup command and checks its reply is not an error. what names
 * the step for the message ("refused the credentials"). The reply is
 * returned in *out when out is not NULL, else freed.
 */
static int
setup_command(sink *s, int argc, const char **argv, const char *what, redisReply **out,
              struct outbox_error *err)
{
    struct redis_sink *r = s->impl;
    redisReply *reply = redisCommandArgv(r->context, argc, argv, NULL);
    char reason[160];

    if (reply == NULL) {
        int saved_errno = errno;

        return fail_connection(s, saved_errno, "during connect", err);
    }
    if (reply->type == REDIS_REPLY_ERROR) {
        enum outbox_error_code code =
            connect_error_is_transient(reply->str) ? OUTBOX_ERR_CONNECTION : OUTBOX_ERR_CONFIG;

        copy_redis_error(reason, sizeof(reason), reply->str, reply->len);
        if (strncmp(reply->str, "NOAUTH", 6) == 0)
            outbox_error_set(err, code, "redis at %s requires a password: %s", sink_display_url(s),
                             reason);
        else
            outbox_error_set(err, code, "redis at %s %s: %s", sink_display_url(s), what, reason);
        freeReplyObject(reply);
        drop_connection(s);
        return -1;
    }
    if (out != NULL)
        *out = reply;
    else
        freeReplyObject(reply);
    return 0;
}

static int
redis_connect(sink *s, struct outbox_error *err)
{
    struct redis_sink *r = s->impl;
    redisReply *reply = NULL;
    char db[16];

    drop_connection(s);
    r->context = redisConnectWithTimeout(s->url.host, s->url.port,
                                         timeval_from_ms(s->options.connect_timeout_ms));
    if (r->context == NULL)
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    if (r->context->err != 0) {
        char reason[128];

        copy_redis_error(reason, sizeof(reason), r->context->errstr, strlen(r->context->errstr));
        outbox_error_set(err, OUTBOX_ERR_CONNECTION, "unable to connect to redis at %s: %s",
                         sink_display_url(s), reason);
        drop_connection(s);
        return -1;
    }
    if (redisSetTimeout(r->context, timeval_from_ms(s->options.io_timeout_ms)) != REDIS_OK ||
        redisEnableKeepAlive(r->context) != REDIS_OK) {
        outbox_error_set(err, OUTBOX_ERR_CONNECTION,
                         "unable to set socket options on the redis connection to %s",
                         sink_display_url(s));
        drop_connection(s);
        return -1;
    }

    if (s->url.password != NULL) {
        const char *argv[3] = {"AUTH", NULL, NULL};
        int argc = 1;

        if (s->url.user != NULL)
            argv[argc++] = s->url.user;
        argv[argc++] = s->url.password;
        if (setup_command(s, argc, argv, "refused the credentials", NULL, err) != 0)
            return -1;
    }
    if (s->url.db != 0) {
        const char *argv[2] = {"SELECT", db};

        snprintf(db, sizeof(db), "%d", s->url.db);
        if (setup_command(s, 2, argv, "refused to select the database", NULL, err) != 0)
            return -1;
    }
    {
        const char *argv[3] = {"SCRIPT", "LOAD", APPEND_SCRIPT};

        if (setup_command(s, 3, argv, "refused to load the append script", &reply, err) != 0)
            return -1;
    }
    if (reply->type != REDIS_REPLY_STRING || reply->len != 40) {
        freeReplyObject(reply);
        outbox_error_set(err, OUTBOX_ERR_BROKER,
                         "redis at %s answered SCRIPT LOAD with something other than a sha1",
                         sink_display_url(s));
        drop_connection(s);
        return -1;
    }
    memcpy(r->sha, reply->str, 40);
    r->sha[40] = '\0';
    freeReplyObject(reply);
    r->last_used_ms = now_ms();
    s->connected = true;
    return 0;
}

/* Makes the scratch key buffer hold at least size bytes; -1 when out of memory. */
static int
reserve_keys(struct redis_sink *r, size_t size)
{
    char *bigger;

    if (size <= r->keys_capacity)
        return 0;
    bigger = realloc(r->keys, size);
    if (bigger == NULL)
        return -1;
    r->keys = bigger;
    r->keys_capacity = size;
    return 0;
}

/* Appends the script call for one message to the output buffer; -1 when out of memory. */
static int
append_message(sink *s, const struct sink_message *message, enum script_call call)
{
    struct redis_sink *r = s->impl;
    const char *prefix = s->options.stream_prefix;
    const char *queue = message->queue != NULL ? message->queue : "";
    size_t prefix_len = strlen(prefix), queue_len = strlen(queue);
    size_t stream_len = prefix_len + queue_len, dedup_len;
    char job_id[24], attempt[16], *dedup;
    const char *argv[12];
    size_t argvlen[12];

    if (reserve_keys(r, 2 * stream_len + sizeof(DEDUP_INFIX) + sizeof(job_id) + 2) != 0)
        return -1;
    snprintf(job_id, sizeof(job_id), "%" PRId64, message->job_id);
    snprintf(attempt, sizeof(attempt), "%" PRId32, message->attempt);
    memcpy(r->keys, prefix, prefix_len);
    memcpy(r->keys + prefix_len, queue, queue_len);
    r->keys[stream_len] = '\0';
    dedup = r->keys + stream_len + 1;
    memcpy(dedup, r->keys, stream_len);
    memcpy(dedup + stream_len, DEDUP_INFIX, sizeof(DEDUP_INFIX) - 1);
    dedup_len = stream_len + sizeof(DEDUP_INFIX) - 1;
    memcpy(dedup + dedup_len, job_id, strlen(job_id) + 1);
    dedup_len += strlen(job_id);

    argv[0] = call == CALL_EVALSHA ? "EVALSHA" : "EVAL";
    argv[1] = call == CALL_EVALSHA ? r->sha : APPEND_SCRIPT;
    argv[2] = "2";
    argv[3] = r->keys;
    argvlen[3] = stream_len;
    argv[4] = dedup;
    argvlen[4] = dedup_len;
    argv[5] = r->window_ms;
    argv[6] = r->maxlen;
    argv[7] = job_id;
    argv[8] = queue;
    argvlen[8] = queue_len;
    argv[9] = message->payload != NULL ? message->payload : "null";
    argvlen[9] = message->payload != NULL ? message->payload_len : 4;
    argv[10] = message->headers != NULL ? message->headers : "{}";
    argv[11] = attempt;
    for (int i = 0; i < 12; i++)
        if (i != 3 && i != 4 && i != 8 && i != 9)
            argvlen[i] = strlen(argv[i]);
    return redisAppendCommandArgv(r->context, 12, argv, argvlen) == REDIS_OK ? 0 : -1;
}

/*
 * Turns the reply for one message into its outcome. Returns true when the
 * reply was NOSCRIPT to an EVALSHA, i.e. the message must be sent again
 * with EVAL (nothing ran for it).
 */
static bool
settle_message(sink *s, const struct sink_message *message, const redisReply *reply,
               enum script_call call, struct sink_outcome *outcome)
{
    char reason[SINK_REASON_MAX - 64];

    if (reply->type == REDIS_REPLY_ERROR) {
        if (call == CALL_EVALSHA && strncmp(reply->str, "NOSCRIPT", 8) == 0)
            return true;
        copy_redis_error(reason, sizeof(reason), reply->str, reply->len);
        sink_outcome_set(outcome, SINK_FAILED, "redis refused the append to '%s%.100s': %s",
                         s->options.stream_prefix, message->queue, reason);
        return false;
    }
    if (reply->type == REDIS_REPLY_ARRAY && reply->elements == 2 &&
        reply->element[0]->type == REDIS_REPLY_STRING &&
        reply->element[1]->type == REDIS_REPLY_INTEGER) {
        sink_outcome_set(outcome, SINK_ACCEPTED, NULL);
        return false;
    }
    sink_outcome_set(outcome, SINK_FAILED, "redis answered the append with an unexpected reply");
    return false;
}

/*
 * One pipelined pass over messages[indexes[0..n-1]] (all of them in order
 * when indexes is NULL). Indexes answered NOSCRIPT are stored in
 * retry[*retry_count]. On a broken connection every message of the pass
 * without a reply is failed, the sink is disconnected and -1 returned.
 */
static int
pipeline_pass(sink *s, const struct sink_message *messages, const size_t *indexes, size_t n,
              enum script_call call, struct sink_outcome *outcomes, size_t *retry,
              size_t *retry_count, struct outbox_error *err)
{
    struct redis_sink *r = s->impl;
    size_t sent = 0, received = 0;

    while (received < n) {
        redisReply *reply = NULL;
        size_t at;

        while (sent < n && sent - received < PIPELINE_WINDOW) {
            at = indexes != NULL ? indexes[sent] : sent;
            if (append_message(s, &messages[at], call) != 0) {
                for (size_t i = received; i < n; i++)
                    sink_outcome_set(&outcomes[indexes != NULL ? indexes[i] : i], SINK_FAILED,
                                     "out of memory while publishing to redis");
                outbox_error_set(err, OUTBOX_ERR_INTERNAL,
                                 "out of memory while publishing to redis");
                drop_connection(s);
                return -1;
            }
            sent++;
        }
        if (redisGetReply(r->context, (void **)&reply) != REDIS_OK || reply == NULL) {
            int saved_errno = errno;

            for (size_t i = received; i < n; i++)
                sink_outcome_set(&outcomes[indexes != NULL ? indexes[i] : i], SINK_FAILED,
                                 "no reply from redis: %s",
                                 r->context->errstr[0] != '\0' ? r->context->errstr
                                                               : "connection lost");
            return fail_connection(s, saved_errno, "while publishing", err);
        }
        at = indexes != NULL ? indexes[received] : received;
        if (settle_message(s, &messages[at], reply, call, &outcomes[at]))
            retry[(*retry_count)++] = at;
        freeReplyObject(reply);
        received++;
    }
    r->last_used_ms = now_ms();
    return 0;
}

static int
redis_publish(sink *s, const struct sink_message *messages, size_t count,
              struct sink_outcome *outcomes, struct outbox_error *err)
{
    size_t limit = s->options.max_message_bytes;
    size_t *retry, *sendable = NULL, sendable_count = 0, retry_count = 0, unused = 0;
    int rc = 0;

    if (count == 0)
        return 0;
    retry = malloc(count * sizeof(*retry));
    sendable = malloc(count * sizeof(*sendable));
    if (retry == NULL || sendable == NULL) {
        free(retry);
        free(sendable);
        for (size_t i = 0; i < count; i++)
            sink_outcome_set(&outcomes[i], SINK_FAILED, "out of memory while publishing to redis");
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    }
    for (size_t i = 0; i < count; i++) {
        if (messages[i].payload_len > limit) {
            /* never sent: it would be refused the same way on every attempt */
            sink_outcome_set(&outcomes[i], SINK_REJECTED,
                             "message of %zu bytes exceeds the limit of %zu bytes",
                             messages[i].payload_len, limit);
            continue;
        }
        sink_outcome_set(&outcomes[i], SINK_FAILED, "no reply from redis");
        sendable[sendable_count++] = i;
    }
    if (sendable_count > 0)
        rc = pipeline_pass(s, messages, sendable_count == count ? NULL : sendable, sendable_count,
                           CALL_EVALSHA, outcomes, retry, &retry_count, err);
    if (rc == 0 && retry_count > 0) {
        /* the script cache was flushed (SCRIPT FLUSH, restart behind a proxy, failover) */
        rc =
            pipeline_pass(s, messages, retry, retry_count, CALL_EVAL, outcomes, NULL, &unused, err);
    }
    free(retry);
    free(sendable);
    return rc;
}

static int
redis_idle(sink *s, struct outbox_error *err)
{
    struct redis_sink *r = s->impl;
    redisReply *reply;

    if (now_ms() - r->last_used_ms < IDLE_PING_MS)
        return 0;
    reply = redisCommand(r->context, "PING");
    if (reply == NULL) {
        int saved_errno = errno;

        return fail_connection(s, saved_errno, "a ping", err);
    }
    if (reply->type == REDIS_REPLY_ERROR) {
        char reason[160];

        copy_redis_error(reason, sizeof(reason), reply->str, reply->len);
        freeReplyObject(reply);
        outbox_error_set(err, OUTBOX_ERR_BROKER, "redis at %s failed a ping: %s",
                         sink_display_url(s), reason);
        drop_connection(s);
        return -1;
    }
    freeReplyObject(reply);
    r->last_used_ms = now_ms();
    return 0;
}

static void
redis_disconnect(sink *s)
{
    drop_connection(s);
}

static void
redis_destroy(sink *s)
{
    struct redis_sink *r = s->impl;

    if (r == NULL)
        return;
    if (r->context != NULL)
        redisFree(r->context);
    free(r->keys);
    free(r);
    s->impl = NULL;
}

const struct sink_ops sink_redis_ops = {
    .kind = "redis",
    .init = redis_init,
    .connect = redis_connect,
    .publish = redis_publish,
    .idle = redis_idle,
    .disconnect = redis_disconnect,
    .destroy = redis_destroy,
};
