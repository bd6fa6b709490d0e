/*
 * exit_status.h - the exit statuses of outbox-relay and outboxctl.
 *
 * Both programs end the same way (docs/reference.md): 0 for success or a
 * clean stop, EXIT_RUNTIME when the work could not be done (a database or
 * broker that stays unreachable, a missing schema), EXIT_USAGE for a bad
 * option or configuration, after a one-line message naming it.
 */
#ifndef OUTBOX_EXIT_STATUS_H
#define OUTBOX_EXIT_STATUS_H

#define EXIT_RUNTIME 1
#define EXIT_USAGE 2

#endif
