/*
 * cloudevents.h - a claimed row's message as a CloudEvent (spec 1.0.2).
 *
 * With --cloudevents binary or structured, each message a pipeline built
 * (job_message_from_job) is turned into a CloudEvent before it goes to the
 * sink; with off (the default) nothing here runs and messages stay as they
 * were, byte for byte. The sinks know nothing of CloudEvents: binary mode
 * hands them extra headers already named by their binding's prefix
 * (sink_cloudevents_prefix) and the media type of the body; structured mode
 * hands them an application/cloudevents+json body holding the row's payload
 * as data (JSON kept as JSON).
 *
 * Attributes: specversion 1.0; id the message id (the one consumers
 * deduplicate on, from job_message.h); source --cloudevents-source, else
 * "urn:outbox:<database id>"; type the row's "ce_type" header, else the
 * queue; time the row's created_at; subject the row's "ce_subject" header;
 * datacontenttype application/json; traceparent and tracestate (the
 * distributed tracing extension) from the row's headers of those names;
 * partitionkey the ordering key; sequence the row's place in its stream
 * queue (39 digits, ordered as text); and any further "ce_<name>" header of
 * the row as attribute <name>. A name must be [a-z0-9]{1,20} and none of
 * the attributes the relay sets (enqueue refuses such a row, migration
 * 025); a row written before that check with a bad one keeps its header
 * out of the event rather than failing. The row's "ce_" headers are taken
 * out of its ordinary headers, the others stay.
 *
 * A struct cloudevents belongs to one pipeline: it keeps the events of the
 * batch being published, and a message it filled lives no longer than the
 * next cloudevents_reset().
 */
#ifndef OUTBOX_RELAY_CLOUDEVENTS_H
#define OUTBOX_RELAY_CLOUDEVENTS_H

#include <stdbool.h>
#include <stddef.h>

#include "sink.h"
#include "store_identity.h"

/* --cloudevents, in the order of its choices. */
enum cloudevents_mode {
    CLOUDEVENTS_OFF = 0,    /* messages as they always were */
    CLOUDEVENTS_BINARY,     /* attributes as headers, the payload as the body */
    CLOUDEVENTS_STRUCTURED, /* the whole event as the body, application/cloudevents+json */
};

/* The choices of --cloudevents, for the option table. */
#define CLOUDEVENTS_CHOICES "off|binary|structured"

/* The structured body's media type. */
#define CLOUDEVENTS_STRUCTURED_TYPE "application/cloudevents+json; charset=utf-8"

typedef struct cloudevents cloudevents;

/*
 * A pipeline's CloudEvents in mode, source the --cloudevents-source (NULL:
 * from the database's identity; copied). NULL when mode is off, or out of
 * memory (the caller checks the mode to tell).
 */
cloudevents *cloudevents_new(int mode, const char *source);
void cloudevents_free(cloudevents *ce);

/* Forgets the events of the last batch (their storage is kept for the next). */
void cloudevents_reset(cloudevents *ce);

/*
 * Turns message into a CloudEvent, identity being the database's the row
 * came from, prefix the sink's (sink_cloudevents_prefix). A no-op with ce
 * NULL (off). 0, or -1 when out of memory: the message is then left as it
 * was, and must not be published.
 */
int cloudevents_apply(cloudevents *ce, const char *prefix, const struct store_identity *identity,
                      struct sink_message *message);

/* True when name may be a producer's attribute (its "ce_<name>" header): see above. */
bool cloudevents_attribute_name_allowed(const char *name, size_t length);

#endif
