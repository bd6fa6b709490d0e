/*
 * sink.c - the common part of every sink: the shared options, the display
 * URL, endpoints, dispatch to the broker's operations.
 *
 * The broker is chosen once, at sink_new(), by the URL's scheme from the
 * registry (sink_registry.c). sink.c never reads a broker's own options: it
 * hands each module its configuration block (or one of defaults).
 */
#include "sink_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "error.h"
#include "timeouts.h"

/* ---- sinks ---------------------------------------------------------------- */

/* A random endpoint index below count, so that relays spread over a cluster's nodes. */
static size_t
random_endpoint(size_t count)
{
    unsigned int value;

    if (count <= 1)
        return 0;
    if (getrandom(&value, sizeof(value), GRND_NONBLOCK) != (ssize_t)sizeof(value))
        value = (unsigned int)getpid() ^ (unsigned int)time(NULL) ^ (unsigned int)clock();
    return value % count;
}

/* Puts a copy of password in url, in place of (and wiping) the URL's own. */
static int
replace_password(struct broker_url *url, const char *password, struct outbox_error *err)
{
    char *copy = strdup(password);

    if (copy == NULL)
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    if (url->password != NULL) {
        memset(url->password, 0, strlen(url->password));
        free(url->password);
    }
    url->password = copy;
    return 0;
}

sink *
sink_new(const struct sink_options *options, struct outbox_error *err)
{
    sink *s = calloc(1, sizeof(*s));
    void *defaults = NULL;
    size_t type;

    if (s == NULL) {
        outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
        return NULL;
    }
    s->options = *options;
    s->options.url = strdup(options->url != NULL ? options->url : "");
    s->display_url = url_redact(options->url);
    memset(s->options.broker_config, 0, sizeof(s->options.broker_config)); /* not kept */
    if (s->options.url == NULL || s->display_url == NULL) {
        outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
        goto fail;
    }
    if (s->options.connect_timeout_ms <= 0)
        s->options.connect_timeout_ms = TIMEOUT_BROKER_CONNECT_MS;
    if (s->options.io_timeout_ms <= 0)
        s->options.io_timeout_ms = TIMEOUT_BROKER_IO_MS;
    if (s->options.max_message_bytes == 0)
        s->options.max_message_bytes = SINK_DEFAULT_MAX_MESSAGE_BYTES;
    s->options.password = NULL; /* copied into s->url below, not kept */
    s->options.password_file = NULL;
    if (sink_url_parse(options->url, &s->url, err) != 0)
        goto fail;
    if (options->password != NULL && replace_password(&s->url, options->password, err) != 0)
        goto fail;
    s->type = sink_type_of_scheme(s->url.scheme, &type);
    s->ops = s->type->ops;
    for (size_t i = 0; i < s->url.endpoint_count; i++)
        url_endpoint_format(&s->url.endpoints[i], s->endpoint_names[i],
                            sizeof(s->endpoint_names[i]));
    s->endpoint = s->ops->endpoint_alternatives ? random_endpoint(s->url.endpoint_count) : 0;
    /* a caller that set none of this broker's options gets its defaults */
    if (options->broker_config[type] == NULL && (defaults = sink_config_new(s->type)) == NULL) {
        outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
        goto fail;
    }
    if (s->ops->init(s, defaults != NULL ? defaults : options->broker_config[type], err) != 0)
        goto fail;
    sink_config_free(s->type, defaults);
    return s;

fail:
    if (s->type != NULL)
        sink_config_free(s->type, defaults);
    sink_free(s);
    return NULL;
}

void
sink_free(sink *s)
{
    if (s == NULL)
        return;
    if (s->ops != NULL && s->impl != NULL) {
        if (s->connected)
            s->ops->disconnect(s);
        s->ops->destroy(s);
    }
    url_clear(&s->url);
    free((char *)s->options.url);
    free(s->display_url);
    free(s);
}

const char *
sink_kind(const sink *s)
{
    return s->type->kind;
}

const char *
sink_display_url(const sink *s)
{
    return s->display_url;
}

const char *
sink_target(const sink *s)
{
    return sink_endpoint_count(s) > 1 ? s->endpoint_names[s->endpoint] : s->display_url;
}

/*
 * After an operation on a connected sink: when it lost the connection, the
 * next connect starts at the following endpoint.
 */
static void
next_endpoint_if_lost(sink *s)
{
    if (!s->connected && sink_endpoint_count(s) > 1)
        s->endpoint = (s->endpoint + 1) % s->url.endpoint_count;
}

int
sink_connect(sink *s, struct outbox_error *err)
{
    size_t count = sink_endpoint_count(s);
    bool refused_login = false;
    struct outbox_error last;

    if (s->connected)
        return 0;
    if (count <= 1)
        return s->ops->connect(s, err);
    for (size_t tried = 0; tried < count; tried++) {
        if (s->ops->connect(s, &last) == 0)
            return 0;
        refused_login |= last.code == OUTBOX_ERR_CONFIG;
        s->endpoint = (s->endpoint + 1) % count;
    }
    /* a full round: s->endpoint is back where it started */
    return outbox_error_set(err, refused_login ? OUTBOX_ERR_CONFIG : last.code,
                            "no endpoint of %s answered (%zu tried), the last: %s",
                            s->display_url, count, last.message);
}

int
sink_connect_endpoint(sink *s, size_t index, struct outbox_error *err)
{
    if (index >= sink_endpoint_count(s))
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "no endpoint %zu", index + 1);
    sink_disconnect(s);
    s->endpoint = index;
    return s->ops->connect(s, err);
}

size_t
sink_endpoint_count(const sink *s)
{
    if (s->url.endpoint_count > 1 && !s->ops->endpoint_alternatives)
        return 0;
    return s->url.endpoint_count;
}

const char *
sink_endpoint_name(const sink *s, size_t index)
{
    return index < sink_endpoint_count(s) ? s->endpoint_names[index] : "";
}

size_t
sink_endpoint(const sink *s)
{
    return s->endpoint;
}

bool
sink_is_connected(const sink *s)
{
    return s->connected;
}

int
sink_publish(sink *s, const struct sink_message *messages, size_t count,
             struct sink_outcome *outcomes, struct outbox_error *err)
{
    int rc;

    if (!s->connected) {
        for (size_t i = 0; i < count; i++)
            sink_outcome_set(&outcomes[i], SINK_DEFERRED, "%s broker not connected",
                             s->type->kind);
        return outbox_error_set(err, OUTBOX_ERR_CONNECTION, "%s broker not connected",
                                s->type->kind);
    }
    rc = s->ops->publish(s, messages, count, outcomes, err);
    next_endpoint_if_lost(s);
    return rc;
}

int
sink_check(sink *s, struct outbox_error *err)
{
    if (!s->connected)
        return outbox_error_set(err, OUTBOX_ERR_CONNECTION, "%s broker not connected",
                                s->type->kind);
    return s->ops->check != NULL ? s->ops->check(s, err) : 0;
}

bool
sink_replication(const sink *s, struct sink_replication *replication)
{
    *replication = (struct sink_replication){.replicas = "", .wait_option = "", .wait_field = ""};
    if (s->ops->replication != NULL)
        s->ops->replication(s, replication);
    return replication->replicas[0] != '\0';
}

void
sink_set_redelivery_horizon(sink *s, int64_t horizon_ms)
{
    if (s->ops->redelivery_horizon != NULL)
        s->ops->redelivery_horizon(s, horizon_ms);
}

int
sink_idle(sink *s, struct outbox_error *err)
{
    int rc;

    if (!s->connected)
        return 0;
    rc = s->ops->idle(s, err);
    next_endpoint_if_lost(s);
    return rc;
}

void
sink_disconnect(sink *s)
{
    if (s->connected)
        s->ops->disconnect(s);
    s->connected = false;
}

void
sink_outcome_set(struct sink_outcome *outcome, enum sink_status status, const char *format, ...)
{
    outcome->status = status;
    outcome->reason[0] = '\0';
    if (format != NULL) {
        va_list ap;

        va_start(ap, format);
        vsnprintf(outcome->reason, sizeof(outcome->reason), format, ap);
        va_end(ap);
    }
}
