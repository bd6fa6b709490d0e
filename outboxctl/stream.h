/*
 * stream.h - outboxctl stream enable / disable / list (see docs/stream.md).
 *
 * Parses its own arguments (the subcommand, a QUEUE, --partitions N,
 * --database-url, --help), connects, and reports in outboxctl's manner:
 * one lowercase line on stderr, exit 2 for a usage error or a value the
 * database refused as invalid, 1 for a runtime error.
 */
#ifndef OUTBOXCTL_STREAM_H
#define OUTBOXCTL_STREAM_H

/*
 * Runs "stream ..." from argv[first] (the subcommand) on. database_url may
 * be NULL (then --database-url must be given). Returns the exit status.
 */
int outboxctl_stream(const char *database_url, int argc, char **argv, int first);

/* The usage lines of the stream commands, for outboxctl --help. */
extern const char outboxctl_stream_usage[];

#endif
