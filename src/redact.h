/*
 * redact.h - passwords out of URLs, libpq conninfo strings and the messages
 * quoting them.
 *
 * The library's errors pass every libpq message through url_redact_message()
 * and the relay's broker URLs share the URI lexing (percent-decoding, the
 * scheme), so this lives with the library. It is plain string work on libc
 * alone, below error.c: nothing here sets an error, and nothing here ever
 * returns or stores a password.
 */
#ifndef OUTBOX_REDACT_H
#define OUTBOX_REDACT_H

#include <stddef.h>

/* The value of one hex digit, or -1. */
int url_hex_value(char c);

/* Percent-decodes [start, start+len) into a new string; NULL on a bad escape or "%00". */
char *url_percent_decode(const char *start, size_t len);

/*
 * Length of a URI scheme followed by "://" at the start of text
 * ([A-Za-z][A-Za-z0-9+.-]*), or 0 when text is not a URI (then it is a
 * conninfo, as libpq decides).
 */
size_t url_scheme_length(const char *text);

/*
 * Names the URI schemes whose userinfo without ':' is a secret as a whole
 * (a token: scheme://token@host) rather than a user name: a NULL-terminated
 * list, kept, not copied. NULL, the default, names none. A program that
 * knows such schemes (the relay's broker registry) sets it before main()
 * runs; nothing changes it after, so every thread reads it unlocked.
 */
void url_redact_token_schemes(const char *const *schemes);

/*
 * Returns a malloc'd copy of a URL or libpq conninfo with any password
 * (or token, see url_redact_token_schemes) replaced by "***", or NULL when
 * out of memory.
 */
char *url_redact(const char *text);

/*
 * Copies message into out (size bytes) with every password it may hold
 * replaced by "***". This is the one place every libpq message passes
 * through before it reaches an error or a log, since libpq quotes the
 * URL, or the piece of it it could not read, in its messages. Removed:
 * - the passwords of source (a libpq URI or conninfo, may be NULL) as
 *   written and percent-decoded, wherever they appear, and any piece of one
 *   (between '@', '/', ':', '?') that appears inside double quotes, since a
 *   password holding '@' or '/' is split by libpq's reading of the URI;
 * - password (may be NULL), e.g. PQpass() of the connection, and
 *   $PGPASSWORD;
 * - in any text, the password of a URI's userinfo (scheme://user:pass@) and
 *   the value of password=, as a conninfo keyword or a query parameter,
 *   quoted or not.
 */
void url_redact_message(const char *message, const char *source, const char *password, char *out,
                        size_t size);

#endif
