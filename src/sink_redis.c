/*
 * sink_redis.c - the Redis Streams sink.
 *
 * Every message becomes one stream entry, exactly
 *
 *   XADD <stream_prefix><suffix> [MAXLEN ~ N] * job_id <id> queue <queue>
 *        payload <json> headers <json> attempt <n>
 *
 * where the suffix is the row's routing key, else its queue (stream_suffix()).
 *
 * and is appended at most once per job per stream within the dedup window.
 * The check and the append are one atomic step in Redis: APPEND_SCRIPT below
 * is loaded with SCRIPT LOAD on connect and called with EVALSHA (EVAL with
 * the script text when the server answers NOSCRIPT, e.g. after SCRIPT FLUSH
 * or a failover; EVAL also caches it again), one call for up to
 * SCRIPT_CHUNK messages, which costs Redis about a third less than a call
 * per message. A job whose dedup record exists is answered with the entry id
 * recorded earlier and counts as accepted, so a relay that died after the
 * append and before marking its row never appends the row a second time
 * when the row is claimed again.
 *
 * Dedup key layout: "<stream>:outbox-dedup:<job_id>", or for a row an
 * operator replayed n times (outboxctl replay) "<stream>:outbox-dedup:<job_id>:<n>",
 * so each replay appends the job once more, and at most once; a plain string whose
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
 * A batch is pipelined: script calls are appended with redisAppendCommandArgv
 * and their replies read in order, with at most PIPELINE_WINDOW messages in
 * flight so the output buffer stays bounded for huge batches. An error in
 * the reply for one message (WRONGTYPE, or OOM over maxmemory) fails only
 * that message; an error for a whole call (BUSY, LOADING) fails the
 * messages of that call. A broken connection or a timeout fails every
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

#include "clock.h"
#include "error.h"

#define DEFAULT_DEDUP_WINDOW_MS (24LL * 60 * 60 * 1000)
#define PIPELINE_WINDOW 4096
#define IDLE_PING_MS 1000 /* ping when idle this long */
#define DEDUP_INFIX ":outbox-dedup:"

/*
 * One call appends up to SCRIPT_CHUNK messages. For message i, KEYS[2i-1]
 * is its stream and KEYS[2i] its dedup record; ARGV[1] is the window in ms,
 * ARGV[2] the maxlen ("0" for none), ARGV[5i-2 .. 5i+2] its job_id, queue,
 * payload, headers and attempt. The reply has one element per message:
 * {entry id, 1} after an append, {earlier entry id, 0} for a duplicate, or
 * the error XADD raised (WRONGTYPE, say), which fails only that message.
 * Nothing is written before XADD succeeds, so a refused append leaves no
 * dedup record behind.
 */
static const char APPEND_SCRIPT[] =
    "local window, maxlen, out = ARGV[1], ARGV[2], {}\n"
    "for i = 1, #KEYS / 2 do\n"
    "  local stream, dedup, a = KEYS[2 * i - 1], KEYS[2 * i], 5 * i - 2\n"
    "  local existing = redis.call('GET', dedup)\n"
    "  if existing then\n"
    "    out[i] = {existing, 0}\n"
    "  else\n"
    "    local id\n"
    "    if maxlen ~= '0' then\n"
    "      id = redis.pcall('XADD', stream, 'MAXLEN', '~', maxlen, '*', 'job_id', ARGV[a],\n"
    "                       'queue', ARGV[a + 1], 'payload', ARGV[a + 2],\n"
    "                       'headers', ARGV[a + 3], 'attempt', ARGV[a + 4])\n"
    "    else\n"
    "      id = redis.pcall('XADD', stream, '*', 'job_id', ARGV[a], 'queue', ARGV[a + 1],\n"
    "                       'payload', ARGV[a + 2], 'headers', ARGV[a + 3],\n"
    "                       'attempt', ARGV[a + 4])\n"
    "    end\n"
    "    if type(id) == 'table' then\n"
    "      out[i] = id\n"
    "    else\n"
    "      redis.call('SET', dedup, id, 'PX', window)\n"
    "      out[i] = {id, 1}\n"
    "    end\n"
    "  end\n"
    "end\n"
    "return out\n";

/* Messages per script call: long enough to spread its cost, short enough not to stall Redis. */
#define SCRIPT_CHUNK 100
/* Arguments of one call: command, script, numkeys, 2 keys and 5 values a message, 2 shared. */
#define SCRIPT_ARGS (3 + 2 + 7 * SCRIPT_CHUNK)

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
    char *keys; /* scratch: stream key, dedup key, job id, attempt per message of a call */
    size_t keys_capacity;
    const char *argv[SCRIPT_ARGS];
    size_t argvlen[SCRIPT_ARGS];
    long long last_used_ms; /* monotonic time of the last reply */
};

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
    r->last_used_ms = clock_monotonic_ms();
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

/* The stream of a message is stream_prefix + this: its routing key, else its queue. */
static const char *
stream_suffix(const struct sink_message *message)
{
    return message->routing_key != NULL ? message->routing_key : message->queue;
}

/* Bytes of scratch one message takes in append_chunk(). */
static size_t
scratch_size(const sink *s, const struct sink_message *message)
{
    size_t stream_len = strlen(s->options.stream_prefix) + strlen(stream_suffix(message));

    /* stream, dedup record (with ":<replay>"), job id, attempt, each with its NUL */
    return (stream_len + 1) + (stream_len + sizeof(DEDUP_INFIX) + 21 + 12) + 21 + 12;
}

/* Prints value into the scratch at *at and makes it the next argument. */
static void
add_number(struct redis_sink *r, int *argc, size_t *at, long long value)
{
    int len = sprintf(r->keys + *at, "%lld", value);

    r->argv[*argc] = r->keys + *at;
    r->argvlen[(*argc)++] = (size_t)len;
    *at += (size_t)len + 1;
}

/*
 * Appends one script call for messages[order[0..n-1]] to the output buffer;
 * -1 when out of memory. The arguments are laid out as APPEND_SCRIPT reads
 * them: first the keys of every message, then the shared values, then five
 * values a message. Keys and numbers are written into the scratch buffer,
 * the rest points into the messages.
 */
static int
append_chunk(sink *s, const struct sink_message *messages, const size_t *order, size_t n,
             enum script_call call)
{
    struct redis_sink *r = s->impl;
    const char *prefix = s->options.stream_prefix;
    size_t prefix_len = strlen(prefix), infix_len = sizeof(DEDUP_INFIX) - 1, need = 0, at = 0;
    int argc = 0;
    char numkeys[16];

    for (size_t i = 0; i < n; i++)
        need += scratch_size(s, &messages[order[i]]);
    if (reserve_keys(r, need) != 0)
        return -1;
    snprintf(numkeys, sizeof(numkeys), "%zu", 2 * n);
    r->argv[argc++] = call == CALL_EVALSHA ? "EVALSHA" : "EVAL";
    r->argv[argc++] = call == CALL_EVALSHA ? r->sha : APPEND_SCRIPT;
    r->argv[argc++] = numkeys;
    for (int i = 0; i < argc; i++)
        r->argvlen[i] = strlen(r->argv[i]);

    for (size_t i = 0; i < n; i++) {
        const struct sink_message *m = &messages[order[i]];
        const char *suffix = stream_suffix(m);
        size_t stream_len = prefix_len + strlen(suffix);
        char *stream = r->keys + at, *dedup = stream + stream_len + 1;
        int id_len;

        /* "<prefix><suffix>", then "<prefix><suffix>:outbox-dedup:<job_id>[:<replay>]" */
        memcpy(stream, prefix, prefix_len);
        memcpy(stream + prefix_len, suffix, stream_len - prefix_len);
        stream[stream_len] = '\0';
        memcpy(dedup, stream, stream_len);
        memcpy(dedup + stream_len, DEDUP_INFIX, infix_len);
        if (m->replay > 0)
            id_len = sprintf(dedup + stream_len + infix_len, "%" PRId64 ":%" PRId32, m->job_id,
                             m->replay);
        else
            id_len = sprintf(dedup + stream_len + infix_len, "%" PRId64, m->job_id);
        r->argv[argc] = stream;
        r->argvlen[argc++] = stream_len;
        r->argv[argc] = dedup;
        r->argvlen[argc++] = stream_len + infix_len + (size_t)id_len;
        at += 2 * (stream_len + 1) + infix_len + (size_t)id_len;
    }
    r->argv[argc] = r->window_ms;
    r->argvlen[argc++] = strlen(r->window_ms);
    r->argv[argc] = r->maxlen;
    r->argvlen[argc++] = strlen(r->maxlen);
    for (size_t i = 0; i < n; i++) {
        const struct sink_message *m = &messages[order[i]];
        const char *headers = m->headers != NULL ? m->headers : "{}";

        add_number(r, &argc, &at, (long long)m->job_id);
        r->argv[argc] = m->queue;
        r->argvlen[argc++] = strlen(m->queue);
        r->argv[argc] = m->payload != NULL ? m->payload : "null";
        r->argvlen[argc++] = m->payload != NULL ? m->payload_len : 4;
        r->argv[argc] = headers;
        r->argvlen[argc++] = strlen(headers);
        add_number(r, &argc, &at, (long long)m->attempt);
    }
    return redisAppendCommandArgv(r->context, argc, r->argv, r->argvlen) == REDIS_OK ? 0 : -1;
}

/* Turns the reply element for one message into its outcome. */
static void
settle_message(sink *s, const struct sink_message *message, const redisReply *reply,
               struct sink_outcome *outcome)
{
    char reason[SINK_REASON_MAX - 64];

    if (reply->type == REDIS_REPLY_ERROR) {
        copy_redis_error(reason, sizeof(reason), reply->str, reply->len);
        sink_outcome_set(outcome, SINK_FAILED, "redis refused the append to '%s%.100s': %s",
                         s->options.stream_prefix, stream_suffix(message), reason);
        return;
    }
    if (reply->type == REDIS_REPLY_ARRAY && reply->elements == 2 &&
        reply->element[0]->type == REDIS_REPLY_STRING &&
        reply->element[1]->type == REDIS_REPLY_INTEGER) {
        sink_outcome_set(outcome, SINK_ACCEPTED, NULL);
        return;
    }
    sink_outcome_set(outcome, SINK_FAILED, "redis answered the append with an unexpected reply");
}

/*
 * Turns the reply to one script call for messages[order[0..n-1]] into their
 * outcomes. Returns true when the reply was NOSCRIPT to an EVALSHA, i.e.
 * the call must be sent again with EVAL (nothing ran).
 */
static bool
settle_chunk(sink *s, const struct sink_message *messages, const size_t *order, size_t n,
             const redisReply *reply, enum script_call call, struct sink_outcome *outcomes)
{
    char reason[SINK_REASON_MAX - 64];

    if (reply->type == REDIS_REPLY_ARRAY && reply->elements == n) {
        for (size_t i = 0; i < n; i++)
            settle_message(s, &messages[order[i]], reply->element[i], &outcomes[order[i]]);
        return false;
    }
    if (reply->type == REDIS_REPLY_ERROR && call == CALL_EVALSHA &&
        strncmp(reply->str, "NOSCRIPT", 8) == 0)
        return true;
    /* the call as a whole was refused (BUSY, LOADING): all of it failed */
    if (reply->type == REDIS_REPLY_ERROR)
        copy_redis_error(reason, sizeof(reason), reply->str, reply->len);
    else
        snprintf(reason, sizeof(reason), "an unexpected reply");
    for (size_t i = 0; i < n; i++)
        sink_outcome_set(&outcomes[order[i]], SINK_FAILED,
                         "redis refused the append to '%s%.100s': %s", s->options.stream_prefix,
                         stream_suffix(&messages[order[i]]), reason);
    return false;
}

/*
 * One pipelined pass over messages[order[0..n-1]], SCRIPT_CHUNK messages a
 * call, at most PIPELINE_WINDOW messages in flight. The messages of calls
 * answered NOSCRIPT are stored in retry[*retry_count]. On a broken
 * connection every message of the pass without a reply is failed, the sink
 * is disconnected and -1 returned.
 */
static int
pipeline_pass(sink *s, const struct sink_message *messages, const size_t *order, size_t n,
              enum script_call call, struct sink_outcome *outcomes, size_t *retry,
              size_t *retry_count, struct outbox_error *err)
{
    struct redis_sink *r = s->impl;
    size_t sent = 0, received = 0;

    while (received < n) {
        redisReply *reply = NULL;
        size_t chunk;

        while (sent < n && sent - received < PIPELINE_WINDOW) {
            chunk = n - sent < SCRIPT_CHUNK ? n - sent : SCRIPT_CHUNK;
            if (append_chunk(s, messages, order + sent, chunk, call) != 0) {
                for (size_t i = received; i < n; i++)
                    sink_outcome_set(&outcomes[order[i]], SINK_FAILED,
                                     "out of memory while publishing to redis");
                outbox_error_set(err, OUTBOX_ERR_INTERNAL,
                                 "out of memory while publishing to redis");
                drop_connection(s);
                return -1;
            }
            sent += chunk;
        }
        if (redisGetReply(r->context, (void **)&reply) != REDIS_OK || reply == NULL) {
            int saved_errno = errno;

            for (size_t i = received; i < n; i++)
                sink_outcome_set(&outcomes[order[i]], SINK_FAILED, "no reply from redis: %s",
                                 r->context->errstr[0] != '\0' ? r->context->errstr
                                                               : "connection lost");
            return fail_connection(s, saved_errno, "while publishing", err);
        }
        chunk = n - received < SCRIPT_CHUNK ? n - received : SCRIPT_CHUNK;
        if (settle_chunk(s, messages, order + received, chunk, reply, call, outcomes))
            for (size_t i = 0; i < chunk; i++)
                retry[(*retry_count)++] = order[received + i];
        freeReplyObject(reply);
        received += chunk;
    }
    r->last_used_ms = clock_monotonic_ms();
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
        rc = pipeline_pass(s, messages, sendable, sendable_count, CALL_EVALSHA, outcomes, retry,
                           &retry_count, err);
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

    if (clock_monotonic_ms() - r->last_used_ms < IDLE_PING_MS)
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
    r->last_used_ms = clock_monotonic_ms();
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
