/*
 * store_worker.h - what the worker protocol offers the connect path of
 * store.c: the first read of the pauses, before any claim.
 */
#ifndef OUTBOX_STORE_WORKER_H
#define OUTBOX_STORE_WORKER_H

#include "store_exec.h"

/* Reads the pauses now; nothing may be queued. */
int store_pauses_read(outbox_store *store, struct outbox_error *err);

#endif
