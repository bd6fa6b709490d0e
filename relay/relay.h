/*
 * relay.h - the relay daemon: its slots.
 *
 * A relay runs slots, each a thread with its own broker connection (a
 * sink), and serves its databases on them: its own (--database-url, on
 * --concurrency slots, each keeping a connection to it) or those of a list
 * (--databases, on --max-db-connections slots sharing the connections);
 * scheduler.h says which database a slot serves next. A slot loops: claim a
 * batch, publish it, mark what the broker confirmed succeeded and fail the
 * rest with a backoff, then claim again at once while there is work, or
 * wait (LISTEN + adaptive polling for its own database) when there is none.
 * The marks of one batch and the next claim run in the database while the
 * broker takes the batch between them. Between two slices the slot runs
 * the database's maintenance when due: it reaps expired leases, deletes old
 * succeeded rows and samples the backlog for the metrics.
 *
 * Stopping: relay_stop() makes every slot finish the batch in flight and
 * return; nothing claimed is left behind running. The caller (main) owns
 * signals.
 */
#ifndef OUTBOX_RELAY_H
#define OUTBOX_RELAY_H

#include <stdio.h>

#include "config.h"
#include "metrics.h"

typedef struct relay relay;

/* Validates what can be checked offline; NULL with err on failure. */
relay *relay_new(const struct relay_config *config, struct metrics *m, struct outbox_error *err);
void relay_free(relay *r);

/*
 * --check: connect to the database (schema present, every privilege the
 * relay uses granted) and the broker (authenticated, --exchange present),
 * then disconnect. When the broker URL lists several endpoints, each is
 * tried and reported on report, one line each ("broker endpoint h:p:
 * reachable" or "...: skipped: <why>"); one that answers is enough, but a
 * refused login or a missing exchange on any is an error. 0, or -1 with
 * err; *configuration is then true when the fault is in the configuration
 * (a missing privilege or exchange) rather than in reaching a server.
 */
int relay_check(relay *r, FILE *report, bool *configuration, struct outbox_error *err);

/*
 * Starts the slots. When the last of them
 * returns, finished(arg) is called from its thread (finished may be NULL),
 * so the caller need not poll.
 */
int relay_start(relay *r, void (*finished)(void *arg), void *arg, struct outbox_error *err);

/* Asks the slots to stop after their batch in flight; async-safe to call twice. */
void relay_stop(relay *r);

/* True once every slot has returned (after relay_stop, --once, or a fatal error). */
bool relay_finished(relay *r);

/*
 * Joins the slots. Returns 0 after a clean stop, -1 with err when a slot
 * stopped on a fatal error.
 */
int relay_join(relay *r, struct outbox_error *err);

#endif
