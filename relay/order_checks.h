/*
 * order_checks.h - the claims' answers to the checks a broker's order
 * record asks.
 *
 * A row a disabled stream handed to the claims keeps its place in the
 * order it left (sink_order_place), and the broker may keep a record of how
 * far that order was appended (the Redis sink). When the record says the
 * row's place was appended, by a row the database must hold for that to be
 * true, the broker asks instead of appending (sink_outcome.check): a crash
 * that lost commits hands those places to other rows. The stream path
 * answers at once on its idle connection; a slot's claims cannot, since
 * its marks and next claim are in flight while it publishes. So the row
 * is given back without an attempt, its check is answered between two
 * turns, and the verdict goes with every row of that order the slot
 * publishes after (the record ignores a verdict that is not on its check,
 * so an old one costs one more question, never a wrong answer).
 */
#ifndef OUTBOX_RELAY_ORDER_CHECKS_H
#define OUTBOX_RELAY_ORDER_CHECKS_H

#include <stdbool.h>
#include <stddef.h>

#include <libpq-fe.h>

#include "outbox.h"
#include "sink.h"

/* The orders whose checks a slot remembers; the oldest is replaced when full. */
#define ORDER_CHECKS_MAX 32

/* An order (its record, as far as the relay can name it), its last check and the verdict. */
struct order_check {
    char *history; /* the database's history (store_identity.history_name) */
    char *queue;
    char *order; /* sink_order_place.order */
    char check[SINK_CHECK_SIZE];
    char verdict[SINK_CHECK_SIZE + 4]; /* "ok" or "gone" and the check; "" until answered */
};

/* guard: the slot that owns it (struct pipeline). */
struct order_checks {
    struct order_check entries[ORDER_CHECKS_MAX];
    size_t count;
    size_t oldest; /* replaced next once count is ORDER_CHECKS_MAX */
    bool asked;    /* a check waits for its answer */
};

/* Notes that a row of queue's order (in the database's history) asked check. */
void order_checks_ask(struct order_checks *c, const char *history, const char *queue,
                      const char *order, const char *check);

/* The verdict for the rows of queue's order in history, NULL for none. */
const char *order_checks_verdict(const struct order_checks *c, const char *history,
                                 const char *queue, const char *order);

/*
 * Answers the checks asked since the last call on conn, which has no
 * statement in flight: whether the database holds the row each names.
 * who names the slot in the log. 0, or -1 with err (a check not answered
 * is asked again by its rows).
 */
int order_checks_answer(struct order_checks *c, PGconn *conn, const char *who,
                        struct outbox_error *err);

void order_checks_clear(struct order_checks *c);

#endif
