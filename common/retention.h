/*
 * retention.h - how long succeeded rows are kept unless told otherwise.
 *
 * The relay's --retention and outboxctl's cleanup and status share this
 * default, so it lives with the library both link rather than in either
 * program's configuration (see docs/deploy.md, "Retention", for the choice).
 */
#ifndef OUTBOX_RETENTION_H
#define OUTBOX_RETENTION_H

/* A duration as --retention reads it. */
#define OUTBOX_RETENTION_DEFAULT "1h"

#endif
