/*
 * console_auth.h - the console's access control: the token file, logins
 * and their sessions, CSRF tokens, and who a request is.
 */
#ifndef OUTBOX_CONSOLE_AUTH_H
#define OUTBOX_CONSOLE_AUTH_H

#include <stdbool.h>
#include <stddef.h>

#include "console_request.h"

/*
 * Reads the token file: its first line, 16 to 4096 visible ASCII characters
 * (trailing blanks cut), in a file group and others cannot open. 0, or -1
 * after a message.
 */
int console_auth_load(struct console *console, const char *path);

/* Fills request->identity, ->session and ->who from its headers. */
void console_auth_identify(struct console *console, struct console_request *request);

/* True when the CSRF token of request (header, or csrf form field) matches its session. */
/*
 * Failed logins, per client address: console_auth_failed() counts one (and
 * logs it), console_auth_throttled() is true once an address made
 * CONSOLE_LOGIN_FAILURES_MAX of them within CONSOLE_LOGIN_WINDOW_SECONDS;
 * a throttled address is answered 429, its right token too, until the
 * window ends.
 */
void console_auth_failed(struct console *console, const char *peer);
bool console_auth_throttled(struct console *console, const char *peer);

bool console_auth_csrf_ok(const struct console_request *request, const char *form_csrf);

/* Checks a submitted token and opens a session, copied into *opened; false on a mismatch. */
bool console_auth_login(struct console *console, const char *token, struct console_session *opened);

/* Forgets the session of request. */
void console_auth_logout(struct console *console, struct console_request *request);

/*
 * True when authority ("name[:port]", as in Host) names the console: a name
 * it listens as on its port, or an --allow-host name on any port.
 * default_port stands for a missing port ("80" in Host).
 */
bool console_auth_host_ok(const struct console *console, const char *authority,
                          const char *default_port);

/* True when origin ("http[s]://name[:port]", as in Origin) names the console. */
bool console_auth_origin_ok(const struct console *console, const char *origin);

/* True when name may be given to --allow-host: a host name or an IP address, without a port. */
bool console_auth_host_name_valid(const char *name);

/* Constant-time comparison of two NUL-terminated strings. */
bool console_auth_equal(const char *a, const char *b);

/* Fills out with size - 1 random hex digits; -1 when no randomness is available. */
int console_auth_random_hex(char *out, size_t size);

#endif
