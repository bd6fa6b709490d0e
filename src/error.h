/*
 * error.h - filling a struct outbox_error (see outbox.h).
 *
 * Messages are lowercase and unpunctuated, e.g.
 * "unable to claim jobs from 'outbox.job': connection refused".
 */
#ifndef OUTBOX_ERROR_H
#define OUTBOX_ERROR_H

#include "outbox.h"

/* Sets code and a printf-style message; always returns -1 for `return error_set(...)`. */
int outbox_error_set(struct outbox_error *err, enum outbox_error_code code, const char *format,
                     ...) __attribute__((format(printf, 3, 4)));

/*
 * Fills err from a failed libpq result (or the connection when result is
 * NULL): the code from the SQLSTATE class, the message as
 * "<context>: <server message, first line>", with the connection's password
 * and any password-shaped text redacted (url_redact_message). Returns -1.
 */
int outbox_error_from_pg(struct outbox_error *err, PGconn *conn, const PGresult *result,
                         const char *context);

/*
 * The same for a failed connection attempt (conn may be NULL) made from
 * conninfo: every password conninfo holds, and any piece of one libpq
 * quoted, is redacted too. Returns -1.
 */
int outbox_error_from_connect(struct outbox_error *err, PGconn *conn, const char *conninfo,
                              const char *context);

/*
 * Copies at most size - 1 bytes of text into out for quoting in a message,
 * control characters as '?', so the message stays one line whatever the
 * input holds. NULL text gives "". Returns out.
 */
const char *outbox_error_quote(char *out, size_t size, const char *text);

/* Maps a SQLSTATE (5 chars, or NULL for a client-side failure) to a code. */
enum outbox_error_code outbox_error_code_for_sqlstate(const char *sqlstate, bool connection_ok);

#endif
