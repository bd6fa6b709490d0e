/*
 * pipeline.h - the body of one pipeline thread: connect, claim or wait,
 * publish, settle; started by relay.c, one per --concurrency.
 */
#ifndef OUTBOX_RELAY_PIPELINE_H
#define OUTBOX_RELAY_PIPELINE_H


/* arg is the struct pipeline to run. */
void *pipeline_run(void *arg);

#endif
