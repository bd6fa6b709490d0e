/*
 * sink.c - the common part of every sink: the display URL, endpoints,
 * dispatch to the broker's operations, and what the brokers share
 * (sink_target, sink_outcome_set).
 *
 * The broker is chosen once, at sink_new() (sink_registry.c), by the URL's
 * scheme; from then on every call goes through s->ops.
 */
#include "sink_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

/* ---- sinks ---------------------------------------------------------------- */

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
sink_cloudevents_prefix(const sink *s)
{
    return s->type->cloudevents_prefix;
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
    outcome->check[0] = '\0';
    if (format != NULL) {
        va_list ap;

        va_start(ap, format);
        vsnprintf(outcome->reason, sizeof(outcome->reason), format, ap);
        va_end(ap);
    }
}
