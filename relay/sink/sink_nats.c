/*
 * sink_nats.c - the NATS JetStream sink: one server or a cluster's list.
 * This file connects, runs --check and holds the ops table and registry
 * row; a batch is published in sink_nats_publish.c, its messages built in
 * sink_nats_message.c, and no file of the sink calls back here.
 *
 * Every message is published to the subject subject_prefix + (routing key,
 * else queue), with the payload's JSON text as its body and the headers
 *
 *   Nats-Msg-Id: <dedup id>        (sink.h: <database>:<message_uid>, .r<n>
 *                                  after it for a row replayed n times)
 *   <the row's headers>            (traceparent and tracestate among them)
 *   Outbox-Message-Id: <message id> (the consumers' form; the same text
 *                                  unless the database kept an earlier form)
 *   Outbox-Job-Id, Outbox-Queue, Outbox-Attempt, Content-Type: application/json
 *
 * A message is accepted only on a JetStream ack naming the stream and its
 * sequence. An ack with duplicate: true is accepted too: the stream holds
 * the job already (a relay died between publish and mark, or the row was
 * re-driven), and the server stored it once, since it deduplicates by
 * Nats-Msg-Id within the stream's duplicate window. The relay never creates
 * or alters streams; --check reads those covering the prefix and warns when
 * a window is shorter than the lease plus the longest retry delay.
 *
 * A batch is published asynchronously: every message goes out with
 * js_PublishMsgAsync, at most PENDING_WINDOW without an ack, and the acks
 * come back on the library's thread, which files each under its message
 * (found by the natsMsg's address in a sorted table). The batch waits on a
 * condition variable until every message is answered, the connection closes
 * or io_timeout_ms pass without an answer.
 *
 * Errors by fault:
 * - a subject no stream covers (no responders) fails only its messages;
 * - a stream refusing a message (limits with discard new, say) fails it
 *   with the server's text; one over the stream's size limit is rejected;
 * - a message whose subject is not a valid NATS subject or lies in the
 *   server's reserved spaces ('$...', _INBOX.), with a header JetStream
 *   obeys (any Nats- name), whose headers a NATS header cannot carry or
 *   which exceeds the server's max_payload (from its INFO) is rejected
 *   without publishing;
 * - a lost connection, no answer in time or a JetStream leader election is
 *   no message's fault: those messages are deferred. The library does not
 *   reconnect by itself (a closed connection leaves the sink disconnected),
 *   so that no publish of a batch outlives the batch; the next sink_connect()
 *   connects to the next server of the URL's list (sink.c), which is why a
 *   URL lists every server of a cluster.
 *
 * While a clustered stream elects a new leader no server listens on its
 * subjects, so publishes in that moment get "no responders" like those to a
 * subject without a stream. After the batch, the sink asks the JetStream API
 * once per such subject whether a stream covers it: if none does, its rows
 * fail; if one does (or the API cannot tell), they are deferred.
 */
#include "sink_nats_conn.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "error.h"
#include "log.h"
#include "sink_nats.h"
#include "sink_nats_message.h"
#include "sink_nats_publish.h"

/* Most publishes without an ack at a time. */
#define PENDING_WINDOW 4096
/*
 * The longest --subject-prefix: a publish's control line (HPUB, subject,
 * reply inbox, two sizes) must fit in the server's max_control_line of
 * 4096 bytes with a routing key of 255 bytes after the prefix.
 */
#define SUBJECT_PREFIX_MAX 3700
#define SUBJECT_PREFIX_MAX_TEXT "3700"
/* JetStream API error codes (nats-server's errors.json) the sink tells apart. */
#define JS_ERR_NOT_ENABLED_FOR_ACCOUNT 10039

/*
 * With a credentials file a refused login is tried this many times in all.
 * libnats before 3.8 (Debian 12 ships 3.4.1) leaves the nonce's signature
 * out of CONNECT when its first byte is zero, so one login in 256 is
 * refused for nothing; the server's next nonce gives another signature.
 * Four refusals in a row are the server's word (odds of 2^-32 otherwise).
 */
#define CREDS_LOGIN_TRIES 4

/* ---- connecting --------------------------------------------------------------------- */

static void warn_short_windows(sink *s);

/*
 * Fails with a configuration error naming --nats-creds when path cannot be
 * read. libnats opens the file only at connect, and its error there reads
 * as a failed connection (exit 1) instead of a wrong option. The file's
 * content is never quoted.
 */
static int
check_creds_file(const char *path, struct outbox_error *err)
{
    char quoted[512];
    FILE *file = fopen(path, "r");

    if (file != NULL) {
        fclose(file);
        return 0;
    }
    return outbox_error_set(err, OUTBOX_ERR_CONFIG, "--nats-creds: unable to read '%s': %s",
                            outbox_error_quote(quoted, sizeof(quoted), path), strerror(errno));
}

static int
sink_nats_init(sink *s, const void *options, struct outbox_error *err)
{
    const struct sink_nats_config *config = options;
    struct sink_nats *n = calloc(1, sizeof(*n));
    const char *prefix = config->subject_prefix != NULL ? config->subject_prefix : "";
    const char *problem = sink_nats_subject_problem(prefix, NATS_SUBJECT_PREFIX);
    bool has_creds = config->nats_creds != NULL && config->nats_creds[0] != '\0';

    if (n == NULL)
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    s->impl = n;
    pthread_mutex_init(&n->lock, NULL);
    pthread_cond_init(&n->changed, NULL);
    n->subject_prefix = strdup(prefix);
    n->creds = has_creds ? strdup(config->nats_creds) : NULL;
    if (n->subject_prefix == NULL || (has_creds && n->creds == NULL))
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    if (problem == NULL)
        problem = sink_nats_subject_reserved(prefix);
    if (problem == NULL && strlen(prefix) > SUBJECT_PREFIX_MAX)
        problem = "longer than " SUBJECT_PREFIX_MAX_TEXT " bytes (with a routing key it would pass"
                  " the server's control line of 4096 bytes)";
    if (problem != NULL)
        return outbox_error_set(err, OUTBOX_ERR_CONFIG,
                                "--subject-prefix '%.64s%s' is not a valid nats subject prefix: %s",
                                prefix, strlen(prefix) > 64 ? "..." : "", problem);
    if (has_creds)
        return check_creds_file(n->creds, err);
    return 0;
}

/*
 * Fills options from the URL and the sink options: the endpoint in use
 * (sink.c moves to the next after a loss), user and password or a token,
 * the credentials file, TLS.
 */
static natsStatus
fill_options(sink *s, natsOptions *options)
{
    struct sink_nats *n = s->impl;
    char url[URL_ENDPOINT_TEXT_MAX + 8];
    const char *servers[1] = {url};
    natsStatus st;

    snprintf(url, sizeof(url), "nats://%s", s->endpoint_names[s->endpoint]);
    st = natsOptions_SetServers(options, servers, 1);
    if (st == NATS_OK && s->url.user != NULL && s->url.password != NULL)
        st = natsOptions_SetUserInfo(options, s->url.user, s->url.password);
    else if (st == NATS_OK && (s->url.user != NULL || s->url.password != NULL))
        st = natsOptions_SetToken(options, s->url.user != NULL ? s->url.user : s->url.password);
    if (st == NATS_OK && n->creds != NULL)
        st = natsOptions_SetUserCredentialsFromFiles(options, n->creds, NULL);
    if (st == NATS_OK && s->url.scheme->tls) {
        /*
         * Always verified: the chain against the system CAs (or $SSL_CERT_FILE)
         * and the URL's host name. (--tls-verify is the AMQP sink's option.)
         */
        st = natsOptions_SetSecure(options, true);
        if (st == NATS_OK)
            st = natsOptions_SetExpectedHostname(options, s->url.endpoints[s->endpoint].host);
    }
    if (st == NATS_OK)
        st = natsOptions_SetTimeout(options, s->options.connect_timeout_ms);
    if (st == NATS_OK)
        st = natsOptions_SetAllowReconnect(options, false);
    return st;
}

/* The error code a failed connect deserves: a refused login or TLS setup is configuration. */
static enum outbox_error_code
connect_error_code(natsStatus st)
{
    switch (st) {
    case NATS_CONNECTION_AUTH_FAILED:
    case NATS_NOT_PERMITTED:
    case NATS_SSL_ERROR:
        return OUTBOX_ERR_CONFIG;
    default:
        return OUTBOX_ERR_CONNECTION;
    }
}

/*
 * The error of a connect that failed with st: the library's status, and the
 * server's words when it has some, without the library's source line and
 * never quoting a password or token.
 */
static int
connect_failed(sink *s, natsStatus st, struct outbox_error *err)
{
    const char *detail = nats_GetLastError(NULL), *source_end;
    char redacted[256];

    /* "(conn.c:1905): Authorization Violation": the server's words, without the source line */
    if (detail != NULL && detail[0] == '(' && (source_end = strstr(detail, "): ")) != NULL)
        detail = source_end + 3;
    if (detail != NULL && strcmp(detail, natsStatus_GetText(st)) == 0)
        detail = NULL;
    /* the library's text may quote what it was given */
    url_redact_message(detail != NULL ? detail : "", s->options.url,
                       s->url.password != NULL ? s->url.password : s->url.user, redacted,
                       sizeof(redacted));
    return outbox_error_set(err, connect_error_code(st), "unable to connect to nats at %s: %s%s%s",
                            sink_target(s), natsStatus_GetText(st),
                            redacted[0] != '\0' ? ": " : "", redacted);
}

static int
sink_nats_connect(sink *s, struct outbox_error *err)
{
    struct sink_nats *n = s->impl;
    natsOptions *options = NULL;
    jsOptions js_options;
    natsStatus st;

    sink_nats_drop_connection(s);
    n->closed = false;
    st = natsOptions_Create(&options);
    if (st == NATS_OK)
        st = fill_options(s, options);
    if (st != NATS_OK) {
        natsOptions_Destroy(options);
        return outbox_error_set(err, OUTBOX_ERR_CONFIG, "nats options for %s: %s",
                                sink_display_url(s), natsStatus_GetText(st));
    }
    st = natsConnection_Connect(&n->connection, options);
    for (int tries = 1; st == NATS_CONNECTION_AUTH_FAILED && n->creds != NULL &&
                        tries < CREDS_LOGIN_TRIES;
         tries++)
        st = natsConnection_Connect(&n->connection, options);
    natsOptions_Destroy(options);
    if (st != NATS_OK) {
        n->connection = NULL;
        return connect_failed(s, st, err);
    }
    jsOptions_Init(&js_options);
    js_options.Wait = s->options.io_timeout_ms;
    js_options.PublishAsync.MaxPending = PENDING_WINDOW;
    js_options.PublishAsync.AckHandler = sink_nats_on_ack;
    js_options.PublishAsync.AckHandlerClosure = n;
    js_options.PublishAsync.StallWait = s->options.io_timeout_ms;
    st = natsConnection_JetStream(&n->js, n->connection, &js_options);
    if (st != NATS_OK) {
        sink_nats_drop_connection(s);
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "nats jetstream context: %s",
                                natsStatus_GetText(st));
    }
    n->max_payload = natsConnection_GetMaxPayload(n->connection);
    n->last_used_ms = clock_monotonic_ms();
    s->connected = true;
    if (!n->windows_checked) {
        n->windows_checked = true;
        warn_short_windows(s);
    }
    return 0;
}

/* ---- --check ------------------------------------------------------------------------ */

/* Warns when stream's duplicate window is shorter than a row can stay published but unmarked. */
static int
check_window(sink *s, const char *stream, struct outbox_error *err)
{
    struct sink_nats *n = s->impl;
    jsStreamInfo *info = NULL;
    jsErrCode code = 0;
    natsStatus st = js_GetStreamInfo(&info, n->js, stream, NULL, &code);
    int64_t window_ms;
    char key[64];

    if (st != NATS_OK)
        return outbox_error_set(err, OUTBOX_ERR_BROKER, "unable to read nats stream '%s': %s (%d)",
                                stream, natsStatus_GetText(st), (int)code);
    window_ms = info->Config->Duplicates / 1000000;
    snprintf(key, sizeof(key), "nats-window:%s", stream);
    /* once, not once per pipeline connecting */
    if (n->horizon_ms > 0 && window_ms < n->horizon_ms)
        log_event_limited(key, OUTBOX_LOG_WARN,
                          "nats stream duplicate window shorter than lease plus longest retry delay",
                          "stream=%s duplicate_window_ms=%" PRId64 " needed_ms=%" PRId64, stream,
                          window_ms, n->horizon_ms);
    jsStreamInfo_Destroy(info);
    return 0;
}

/* Lists the streams covering the subjects the relay publishes to ("events.>" for "events.", else any). */
static natsStatus
list_streams(sink *s, jsStreamNamesList **names, char *filter, size_t size, jsErrCode *code)
{
    struct sink_nats *n = s->impl;
    size_t prefix_len = strlen(n->subject_prefix);
    jsOptions options;

    if (prefix_len > 0 && n->subject_prefix[prefix_len - 1] == '.' && prefix_len + 2 <= size)
        snprintf(filter, size, "%s>", n->subject_prefix);
    else
        snprintf(filter, size, ">");
    jsOptions_Init(&options);
    options.Wait = s->options.io_timeout_ms;
    options.Stream.Info.SubjectsFilter = filter;
    return js_StreamNames(names, n->js, &options, code);
}

/*
 * At a sink's first connect: the warning of --check about short duplicate
 * windows, so that a daemon started without --check says it too. Errors
 * are left to the publishes.
 */
static void
warn_short_windows(sink *s)
{
    jsStreamNamesList *names = NULL;
    struct outbox_error ignored;
    jsErrCode code = 0;
    char filter[SUBJECT_PREFIX_MAX + 2];

    if (list_streams(s, &names, filter, sizeof(filter), &code) == NATS_OK && names != NULL)
        for (int i = 0; i < names->Count; i++)
            check_window(s, names->List[i], &ignored);
    jsStreamNamesList_Destroy(names);
}

static int
sink_nats_check(sink *s, struct outbox_error *err)
{
    jsStreamNamesList *names = NULL;
    jsErrCode code = 0;
    char filter[SUBJECT_PREFIX_MAX + 2];
    natsStatus st;
    int rc = 0;

    st = list_streams(s, &names, filter, sizeof(filter), &code);
    if (st == NATS_NO_RESPONDERS || code == JS_ERR_NOT_ENABLED_FOR_ACCOUNT) {
        rc = outbox_error_set(err, OUTBOX_ERR_CONFIG, "jetstream is not enabled at %s",
                              sink_display_url(s));
    } else if (st == NATS_NOT_FOUND || (st == NATS_OK && (names == NULL || names->Count == 0))) {
        rc = outbox_error_set(err, OUTBOX_ERR_CONFIG,
                              "no jetstream stream covers subjects '%s' (the relay never creates"
                              " streams: create one, e.g. nats stream add)", filter);
    } else if (st != NATS_OK) {
        rc = outbox_error_set(err, OUTBOX_ERR_BROKER, "unable to list nats streams: %s (%d)",
                              natsStatus_GetText(st), (int)code);
    } else {
        for (int i = 0; i < names->Count && rc == 0; i++)
            rc = check_window(s, names->List[i], err);
    }
    jsStreamNamesList_Destroy(names);
    if (rc != 0 && err->code == OUTBOX_ERR_CONFIG)
        sink_nats_drop_connection(s);
    return rc;
}

/* ---- the rest ----------------------------------------------------------------------- */

static void
sink_nats_disconnect(sink *s)
{
    sink_nats_drop_connection(s);
}

static void
sink_nats_destroy(sink *s)
{
    struct sink_nats *n = s->impl;

    if (n == NULL)
        return;
    sink_nats_drop_connection(s);
    pthread_mutex_destroy(&n->lock);
    pthread_cond_destroy(&n->changed);
    free(n->subject_prefix);
    free(n->creds);
    free(n->slots);
    free(n->states);
    free(n->messages);
    free(n->subject);
    free(n);
    s->impl = NULL;
}

/* Keeps the redelivery horizon, compared with the stream's duplicate window at connect. */
static void
sink_nats_redelivery_horizon(sink *s, int64_t horizon_ms)
{
    ((struct sink_nats *)s->impl)->horizon_ms = horizon_ms;
}

static const struct sink_ops sink_nats_ops = {
    .init = sink_nats_init,
    .connect = sink_nats_connect,
    .publish = sink_nats_publish,
    .idle = sink_nats_idle,
    .check = sink_nats_check,
    .disconnect = sink_nats_disconnect,
    .destroy = sink_nats_destroy,
    .redelivery_horizon = sink_nats_redelivery_horizon,
    /* any server of a cluster takes publishes for every stream: sink.c picks one per connect */
    .endpoint_alternatives = true,
};

/* ---- registry row ------------------------------------------------------------------- */

static const struct url_scheme sink_nats_scheme = {
    .name = "nats",
    .default_port = 4222,
    .max_endpoints = URL_MAX_ENDPOINTS,
    .usage = "nats://[user:pass@|token@]h1:p1[,h2:p2...]",
    .userinfo_token = true,
};

static const struct url_scheme sink_nats_tls_scheme = {
    .name = "tls",
    .default_port = 4222,
    .max_endpoints = URL_MAX_ENDPOINTS,
    .usage = "tls://... (nats over tls)",
    .tls = true,
    .userinfo_token = true,
};

static const struct url_scheme *const sink_nats_schemes[] = {&sink_nats_scheme,
                                                             &sink_nats_tls_scheme, NULL};

static const struct option_spec sink_nats_options[] = {
    {"subject-prefix", "P", OPTION_STRING, OPTION_FIELD(struct sink_nats_config, subject_prefix), "", 0,
     0, NULL, "NATS subject = P + the row's routing key, else its queue",
     OPTION_FROM_ENVIRONMENT, 0},
    {"nats-creds", "FILE", OPTION_STRING, OPTION_FIELD(struct sink_nats_config, nats_creds), NULL, 0, 0,
     NULL, "NATS: a credentials file (user JWT and seed) for a NATS account",
     OPTION_FROM_ENVIRONMENT, 0},
};

const struct sink_type sink_nats_type = {
    .kind = "nats",
    .product = "NATS JetStream",
    .schemes = sink_nats_schemes,
    .cloudevents_prefix = "ce-", /* the NATS binding */
    .options = sink_nats_options,
    .option_count = sizeof(sink_nats_options) / sizeof(sink_nats_options[0]),
    /* both options default to none (zero): no config_defaults */
    .config_size = sizeof(struct sink_nats_config),
    .ops = &sink_nats_ops,
};
