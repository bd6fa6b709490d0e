/*
 * order_checks.c - the claims' answers to a broker's order record (see
 * order_checks.h).
 */
#include "order_checks.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "log.h"
#include "mutant.h"
#include "store_stream.h"

/* The index of the entry of queue's order in history, -1 for none. */
static int
find(const struct order_checks *c, const char *history, const char *queue, const char *order)
{
    for (size_t i = 0; i < c->count; i++) {
        const struct order_check *e = &c->entries[i];

        if (strcmp(e->order, order) == 0 && strcmp(e->queue, queue) == 0 &&
            strcmp(e->history, history) == 0)
            return (int)i;
    }
    return -1;
}

static void
forget(struct order_check *e)
{
    free(e->history);
    free(e->queue);
    free(e->order);
    memset(e, 0, sizeof(*e));
}

/* A new entry for queue's order in history (the oldest replaced when full), NULL without memory. */
static struct order_check *
add(struct order_checks *c, const char *history, const char *queue, const char *order)
{
    struct order_check *e;

    if (c->count < ORDER_CHECKS_MAX) {
        e = &c->entries[c->count++];
    } else {
        e = &c->entries[c->oldest];
        c->oldest = (c->oldest + 1) % ORDER_CHECKS_MAX;
        forget(e);
    }
    e->history = strdup(history);
    e->queue = strdup(queue);
    e->order = strdup(order);
    if (e->history == NULL || e->queue == NULL || e->order == NULL) {
        forget(e);
        *e = c->entries[--c->count]; /* the last moved into its slot */
        memset(&c->entries[c->count], 0, sizeof(c->entries[c->count]));
        return NULL;
    }
    return e;
}

void
order_checks_ask(struct order_checks *c, const char *history, const char *queue,
                 const char *order, const char *check)
{
    int i = find(c, history, queue, order);
    struct order_check *e = i >= 0 ? &c->entries[i] : add(c, history, queue, order);

    if (e == NULL)
        return; /* not remembered: its rows ask again */
    if (strcmp(e->check, check) != 0 || e->verdict[0] == '\0') {
        snprintf(e->check, sizeof(e->check), "%s", check);
        e->verdict[0] = '\0';
        c->asked = true;
    }
}

const char *
order_checks_verdict(const struct order_checks *c, const char *history, const char *queue,
                     const char *order)
{
    int i;

    if (c->count == 0 || history == NULL || queue == NULL || order == NULL)
        return NULL;
    i = find(c, history, queue, order);
    return i >= 0 && c->entries[i].verdict[0] != '\0' ? c->entries[i].verdict : NULL;
}

int
order_checks_answer(struct order_checks *c, PGconn *conn, const char *who,
                    struct outbox_error *err)
{
    for (size_t i = 0; c->asked && i < c->count; i++) {
        struct order_check *e = &c->entries[i];
        char place[STREAM_PLACE_SIZE], verdict[sizeof(e->verdict)];
        const char *uid = e->check + STREAM_PLACE_SIZE - 1;
        bool held;

        if (e->verdict[0] != '\0' || strlen(e->check) < STREAM_PLACE_SIZE - 1)
            continue;
        snprintf(place, sizeof(place), "%.*s", STREAM_PLACE_SIZE - 1, e->check);
        if (stream_row_held(conn, place, uid, &held, err) != 0)
            return -1;
#ifdef OUTBOX_MUTANTS
        if (!held && mutant_fires("claims_record_trusted")) /* the broker's record believed */
            held = true;
#endif
        if (!held)
            log_event(OUTBOX_LOG_WARN, "stream order record of another database history dropped",
                      "%s queue=%s order=%s place=%s row=%s hint=\"the broker recorded a row this"
                      " database does not hold (a crash lost commits, or a restore): the rows of"
                      " that order the claims publish are appended again\"",
                      who, e->queue, e->order, place, uid[0] != '\0' ? uid : "unnamed");
        snprintf(verdict, sizeof(verdict), "%s%s", held ? "ok" : "gone", e->check);
        memcpy(e->verdict, verdict, sizeof(verdict));
    }
    c->asked = false;
    return 0;
}

void
order_checks_clear(struct order_checks *c)
{
    for (size_t i = 0; i < c->count; i++)
        forget(&c->entries[i]);
    memset(c, 0, sizeof(*c));
}
