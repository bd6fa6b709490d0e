/*
 * sink_amqp.c - the RabbitMQ sink: connecting, idle, --check, its ops table
 * and registry row. The top of the sink: the shared state and connection
 * helpers are in sink_amqp_conn.c, and no file of the sink calls back here.
 *
 * One connection, one channel in confirm mode (SINK_AMQP_CHANNEL); what a
 * batch does on it is in sink_amqp_publish.c and sink_amqp_confirm.c. A
 * lost connection is torn down whole and sink_connect() builds a new one.
 *
 * Heartbeats: the configuration's heartbeat_seconds, 0 disables them; by
 * default TIMEOUT_BROKER_HEARTBEAT_SECONDS.
 *
 * TLS (amqps://): peer certificate and host name are verified unless
 * --tls-verify is no, against the CA file named by SSL_CERT_FILE or else
 * the system bundle /etc/ssl/certs/ca-certificates.crt.
 */
#include "sink_amqp.h"
#include "sink_amqp_confirm.h"
#include "sink_amqp_conn.h"
#include "sink_amqp_publish.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <amqp_framing.h>
#include <amqp_ssl_socket.h>
#include <amqp_tcp_socket.h>

#include "clock.h"
#include "error.h"
#include "json.h"
#include "timeouts.h"

/*
 * librabbitmq trusts no CA by itself: load the OpenSSL-conventional
 * SSL_CERT_FILE when set, else the system bundle.
 */
static int
load_ca_bundle(sink *s, amqp_socket_t *socket, struct outbox_error *err)
{
    const char *ca_file = getenv("SSL_CERT_FILE");

    if (ca_file == NULL || ca_file[0] == '\0')
        ca_file = SINK_AMQP_SYSTEM_CA_FILE;
    if (amqp_ssl_socket_set_cacert(socket, ca_file) != AMQP_STATUS_OK)
        return outbox_error_set(err, OUTBOX_ERR_CONFIG,
                                "unable to load ca certificates from '%s' for %s", ca_file,
                                sink_target(s));
    return 0;
}

static int
sink_amqp_init(sink *s, const void *options, struct outbox_error *err)
{
    const struct sink_amqp_config *config = options;
    const char *exchange = config->exchange != NULL ? config->exchange : "";
    struct sink_amqp *impl;

    if (strlen(exchange) > SINK_AMQP_SHORTSTR_MAX)
        return outbox_error_set(err, OUTBOX_ERR_CONFIG, "--exchange: longer than %d bytes (%zu)",
                                SINK_AMQP_SHORTSTR_MAX, strlen(exchange));
    impl = calloc(1, sizeof(*impl));
    if (impl == NULL)
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    s->impl = impl;
    impl->exchange = strdup(exchange);
    if (impl->exchange == NULL)
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    impl->tls_verify = config->tls_verify;
    impl->heartbeat_seconds = config->heartbeat_seconds;
    return 0;
}

/*
 * Logs in to the vhost on the open socket. A refused login or a missing
 * vhost is OUTBOX_ERR_CONFIG (the broker answers both with
 * connection.close), anything else OUTBOX_ERR_CONNECTION.
 */
static int
log_in(sink *s, struct outbox_error *err)
{
    struct sink_amqp *impl = s->impl;
    amqp_rpc_reply_t reply;
    char text[256];

    reply = amqp_login(impl->conn, sink_amqp_url_vhost(&s->url), 0, SINK_AMQP_FRAME_MAX,
                       impl->heartbeat_seconds > 0 ? impl->heartbeat_seconds : 0,
                       AMQP_SASL_METHOD_PLAIN, s->url.user, s->url.password);
    if (reply.reply_type == AMQP_RESPONSE_NORMAL)
        return 0;
    sink_amqp_describe_reply(reply, text, sizeof(text));
    if (reply.reply_type == AMQP_RESPONSE_SERVER_EXCEPTION &&
        reply.reply.id == AMQP_CONNECTION_CLOSE_METHOD) {
        amqp_connection_close_ok_t close_ok = {0};

        amqp_send_method(impl->conn, 0, AMQP_CONNECTION_CLOSE_OK_METHOD, &close_ok);
        return outbox_error_set(err, OUTBOX_ERR_CONFIG, "unable to log in to %s as '%s': %s",
                                sink_target(s), s->url.user, text);
    }
    return outbox_error_set(err, OUTBOX_ERR_CONNECTION, "unable to log in to %s as '%s': %s",
                            sink_target(s), s->url.user, text);
}

static int
sink_amqp_connect(sink *s, struct outbox_error *err)
{
    struct sink_amqp *impl = s->impl;
    amqp_socket_t *socket;
    struct timeval connect_timeout = timeval_from_ms(s->options.connect_timeout_ms);
    struct timeval rpc_timeout = timeval_from_ms(s->options.io_timeout_ms);
    int rc;

    impl->broker_max_bytes = 0; /* learned again on this connection if need be */
    impl->conn = amqp_new_connection();
    if (impl->conn == NULL)
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    if (s->url.scheme->tls) {
        socket = amqp_ssl_socket_new(impl->conn);
        if (socket != NULL) {
            amqp_ssl_socket_set_verify_peer(socket, impl->tls_verify);
            amqp_ssl_socket_set_verify_hostname(socket, impl->tls_verify);
            if (impl->tls_verify && load_ca_bundle(s, socket, err) != 0)
                goto fail;
        }
    } else {
        socket = amqp_tcp_socket_new(impl->conn);
    }
    if (socket == NULL) {
        outbox_error_set(err, OUTBOX_ERR_INTERNAL, "unable to create a socket for %s",
                         sink_target(s));
        goto fail;
    }
    rc = amqp_socket_open_noblock(socket, s->url.endpoints[s->endpoint].host,
                                  s->url.endpoints[s->endpoint].port, &connect_timeout);
    if (rc != AMQP_STATUS_OK) {
        outbox_error_set(err, OUTBOX_ERR_CONNECTION, "unable to connect to %s: %s",
                         sink_target(s), amqp_error_string2(rc));
        goto fail;
    }
    amqp_set_handshake_timeout(impl->conn, &connect_timeout);
    amqp_set_rpc_timeout(impl->conn, &rpc_timeout);
    if (log_in(s, err) != 0)
        goto fail;
    if (sink_amqp_open_channel(s, err) != 0)
        goto fail;
    s->connected = true;
    return 0;

fail:
    sink_amqp_drop_connection(s);
    return -1;
}

static int
sink_amqp_idle(sink *s, struct outbox_error *err)
{
    struct sink_amqp *impl = s->impl;

    /* Bounded: a handful of stray frames at most, then heartbeats are serviced. */
    for (int i = 0; i < 1000; i++) {
        int rc = sink_amqp_read_one_frame(s, NULL, 0, err);

        if (rc == 0)
            break;
        if (rc == -FRAME_CONNECTION_LOST) {
            sink_amqp_drop_connection(s);
            return -1;
        }
    }
    if (!impl->channel_open && sink_amqp_open_channel(s, err) != 0) {
        sink_amqp_drop_connection(s);
        return -1;
    }
    return 0;
}

/*
 * A passive declare of the exchange: the broker answers declare-ok, or
 * closes the channel with 404 NOT_FOUND. Publishing to a missing exchange
 * would close the channel on every batch.
 */
static int
sink_amqp_check(sink *s, struct outbox_error *err)
{
    struct sink_amqp *impl = s->impl;
    amqp_rpc_reply_t reply;
    char text[256], quoted[SINK_AMQP_SHORTSTR_MAX + 1];

    if (impl->exchange[0] == '\0')
        return 0;
    amqp_exchange_declare(impl->conn, SINK_AMQP_CHANNEL, amqp_cstring_bytes(impl->exchange),
                          amqp_cstring_bytes("direct"), 1, 0, 0, 0, amqp_empty_table);
    reply = amqp_get_rpc_reply(impl->conn);
    if (reply.reply_type == AMQP_RESPONSE_NORMAL)
        return 0;
    sink_amqp_describe_reply(reply, text, sizeof(text));
    outbox_error_quote(quoted, sizeof(quoted), impl->exchange);
    if (reply.reply_type == AMQP_RESPONSE_SERVER_EXCEPTION &&
        reply.reply.id == AMQP_CHANNEL_CLOSE_METHOD &&
        ((const amqp_channel_close_t *)reply.reply.decoded)->reply_code == AMQP_NOT_FOUND) {
        amqp_channel_close_ok_t close_ok = {0};

        amqp_send_method(impl->conn, SINK_AMQP_CHANNEL, AMQP_CHANNEL_CLOSE_OK_METHOD, &close_ok);
        impl->channel_open = false;
        outbox_error_set(err, OUTBOX_ERR_CONFIG, "--exchange: exchange '%s' not found on %s: %s",
                         quoted, sink_display_url(s), text);
    } else {
        outbox_error_set(err, OUTBOX_ERR_CONNECTION, "unable to look up exchange '%s' on %s: %s",
                         quoted, sink_display_url(s), text);
    }
    sink_amqp_drop_connection(s);
    return -1;
}

static void
sink_amqp_disconnect(sink *s)
{
    struct sink_amqp *impl = s->impl;
    struct timeval close_timeout = timeval_from_ms(SINK_AMQP_CLOSE_TIMEOUT_MS);

    if (impl->conn != NULL) {
        amqp_set_rpc_timeout(impl->conn, &close_timeout);
        if (impl->channel_open)
            amqp_channel_close(impl->conn, SINK_AMQP_CHANNEL, AMQP_REPLY_SUCCESS);
        amqp_connection_close(impl->conn, AMQP_REPLY_SUCCESS);
    }
    sink_amqp_drop_connection(s);
}

static void
sink_amqp_destroy(sink *s)
{
    struct sink_amqp *impl = s->impl;

    if (impl == NULL)
        return;
    sink_amqp_drop_connection(s);
    free(impl->entries);
    free(impl->exchange);
    free(impl);
    s->impl = NULL;
}

static const struct sink_ops sink_amqp_ops = {
    .init = sink_amqp_init,
    .connect = sink_amqp_connect,
    .publish = sink_amqp_publish,
    .idle = sink_amqp_idle,
    .check = sink_amqp_check,
    .disconnect = sink_amqp_disconnect,
    .destroy = sink_amqp_destroy,
    .endpoint_alternatives = true,
};

/* ---- registry row --------------------------------------------------------- */

/* What an AMQP URL's path names. */
struct sink_amqp_url_path {
    char *vhost; /* decoded; "/" when the path is empty */
};

static void
sink_amqp_path_free(void *parsed)
{
    struct sink_amqp_url_path *path = parsed;

    if (path != NULL)
        free(path->vhost);
    free(path);
}

/* "/vhost", percent-decoded; "/" when empty. */
static int
sink_amqp_parse_path(const struct url_scheme *scheme, const char *text, void **parsed,
                     struct outbox_error *err)
{
    struct sink_amqp_url_path *path = calloc(1, sizeof(*path));

    (void)scheme;
    if (path == NULL)
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    *parsed = path;
    if (*text == '\0' || text[1] == '\0')
        path->vhost = strdup("/");
    else
        path->vhost = url_percent_decode(text + 1, strlen(text + 1));
    if (path->vhost == NULL)
        return outbox_error_set(err, OUTBOX_ERR_CONFIG, "broker URL has a bad vhost escape");
    return 0;
}

const char *
sink_amqp_url_vhost(const struct broker_url *url)
{
    if (url->scheme == NULL || url->scheme->parse_path != sink_amqp_parse_path || url->path == NULL)
        return NULL;
    return ((const struct sink_amqp_url_path *)url->path)->vhost;
}

static const struct url_scheme sink_amqp_scheme = {
    .name = "amqp",
    .usage = "amqp://user:pass@host:port[,host2:port2...]/vhost",
    .default_port = 5672,
    .max_endpoints = URL_MAX_ENDPOINTS,
    .parse_path = sink_amqp_parse_path,
    .path_free = sink_amqp_path_free,
    .default_user = "guest",
    .default_password = "guest",
};

static const struct url_scheme sink_amqps_scheme = {
    .name = "amqps",
    .usage = "amqps://...",
    .default_port = 5671,
    .max_endpoints = URL_MAX_ENDPOINTS,
    .parse_path = sink_amqp_parse_path,
    .path_free = sink_amqp_path_free,
    .default_user = "guest",
    .default_password = "guest",
    .tls = true,
};

static const struct url_scheme *const sink_amqp_schemes[] = {&sink_amqp_scheme, &sink_amqps_scheme,
                                                             NULL};

#define CONFIG_FIELD(f) OPTION_FIELD(struct sink_amqp_config, f)

static const struct option_spec sink_amqp_options[] = {
    {"exchange", "NAME", OPTION_STRING, CONFIG_FIELD(exchange), "", 0, 0, NULL,
     "AMQP exchange of rows without their own (default: the default exchange)",
     OPTION_FROM_ENVIRONMENT, SINK_AMQP_SHORTSTR_MAX},
    {"tls-verify", "yes|no", OPTION_CHOICE, CONFIG_FIELD(tls_verify), "yes", 0,
     0, "no|yes", "amqps: verify the broker's certificate and host name", OPTION_FROM_ENVIRONMENT,
     0},
};

/* What a sink opened without parsed options uses: the rows' fallbacks. */
static void
sink_amqp_config_defaults(void *config)
{
    ((struct sink_amqp_config *)config)->tls_verify = true;
    ((struct sink_amqp_config *)config)->heartbeat_seconds = TIMEOUT_BROKER_HEARTBEAT_SECONDS;
}

const struct sink_type sink_amqp_type = {
    .kind = "amqp",
    .product = "RabbitMQ",
    .check_help = "--exchange exists",
    .schemes = sink_amqp_schemes,
    /* the AMQP binding (1.0.2): application properties, as RabbitMQ shows 0-9-1 headers */
    .cloudevents_prefix = "cloudEvents:",
    .options = sink_amqp_options,
    .option_count = sizeof(sink_amqp_options) / sizeof(sink_amqp_options[0]),
    .config_size = sizeof(struct sink_amqp_config),
    .config_defaults = sink_amqp_config_defaults,
    .ops = &sink_amqp_ops,
};
