/*
 * job_message.c - the broker message for a claimed row (see job_message.h).
 */
#include "job_message.h"
#include "mutant.h"

#include "log.h"

_Static_assert(SINK_MESSAGE_ID_MAX == STORE_MESSAGE_ID_MAX, "one message id size");

struct sink_message
job_message_from_job(const struct outbox_job *job, const struct store_identity *identity)
{
    struct sink_message m = {
        .job_id = job->job_id,
        .history = identity->history_name,
        .attempt = job->generation,
        .queue = job->queue,
        .payload = job->payload,
        .payload_len = job->payload_len,
        .headers = job->headers,
        .created_at = job->created_at,
        .replay = job->replays,
        .exchange = job->exchange,
        .routing_key = job->routing_key,
        .ordering_key = job->ordering_key,
        /* a replayed row is published once more, whatever its place */
        .place.order = job->replays == 0 ? job->stream_order : NULL,
        .place.at = job->replays == 0 ? job->stream_place : NULL,
        /* its identity, so that a broker's record of the order is checked before believed */
        .place.uid = job->replays == 0 && job->stream_order != NULL ? job->message_uid : NULL,
    };

    store_message_id_format(identity, job->job_id, job->message_uid, job->replays, STORE_MESSAGE_ID,
                            m.message_id);
    store_message_id_format(identity, job->job_id, job->message_uid, job->replays, STORE_DEDUP_ID,
                            m.dedup_id);
#ifdef OUTBOX_MUTANTS
    if (mutant_fires("redis_dedup_ignored")) /* each claim its own dedup record */
        store_message_id_format(identity, job->job_id, job->message_uid,
                                job->replays + 1000 * job->generation, STORE_DEDUP_ID, m.dedup_id);
#endif
    return m;
}

void
job_message_warn_history(const struct store_identity *identity, const char *who)
{
    if (!identity->history_changed || identity->form == STORE_ID_FORM_UID)
        return;
    log_event(OUTBOX_LOG_WARN, "database history changed, message ids may repeat",
              "%s database_id=%s epoch=%d id_form=%s hint=\"consumers deduplicating on the message"
              " id of this form may drop rows of the new history: switch with outboxctl identity"
              " set --id-form uid once they take the form uid\"",
              who, identity->database_id, (int)identity->epoch, store_id_form_name(identity->form));
}
