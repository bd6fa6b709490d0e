/*
 * job_message.h - the broker message for a claimed row.
 *
 * Both pipelines (row-state and stream) hand the sinks one sink_message per
 * claimed outbox_job; the fields map one to one, and the message ids come
 * from the database's identity (store_identity.h). The message borrows the
 * job's strings and the identity's history, so it lives no longer than the
 * batch that holds the job nor the connection that read the identity.
 */
#ifndef OUTBOX_RELAY_JOB_MESSAGE_H
#define OUTBOX_RELAY_JOB_MESSAGE_H

#include "outbox.h"
#include "sink.h"
#include "store_identity.h"

/* The message that publishes job; its pointers borrow job's strings and identity's history. */
struct sink_message job_message_from_job(const struct outbox_job *job,
                                         const struct store_identity *identity);

/*
 * Logs a warning when the observation that filled identity moved its
 * history epoch (a promotion, a restore into another cluster) and the
 * database's message ids are of an earlier form, which such a history can
 * repeat: consumers deduplicating on them may drop rows until the database
 * switches to the form uid. who names the database in the log.
 */
void job_message_warn_history(const struct store_identity *identity, const char *who);

#endif
