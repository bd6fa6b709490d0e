/*
 * maintenance.h - the body of the maintenance thread: its phase table run
 * in turn (reap, release waiting, cleanup, samples); started by relay.c.
 */
#ifndef OUTBOX_RELAY_MAINTENANCE_H
#define OUTBOX_RELAY_MAINTENANCE_H


/* arg is the relay whose maintenance to run. */
void *maintenance_run(void *arg);

#endif
