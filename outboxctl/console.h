/*
 * console.h - the operator's console behind `outboxctl serve`: a small
 * HTTP/1.1 server (console.c), access control (console_auth.c), the JSON API
 * under /api/v1/ (console_api.c), the HTML pages (console_html.c) and their
 * embedded stylesheet and script (console_assets.c).
 *
 * One thread serves one request at a time on one database connection: an
 * operator's page, not a data path. Every answer closes its connection.
 * Every value from the database is escaped where it is written (HTML or
 * JSON); the pages load no script or style but the console's own, under a
 * Content-Security-Policy of default-src 'self'.
 */
#ifndef OUTBOX_CONSOLE_H
#define OUTBOX_CONSOLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <libpq-fe.h>

#include "buffer.h"
#include "outbox.h"

#define CONSOLE_DEFAULT_LISTEN "127.0.0.1:8080"
#define CONSOLE_REQUEST_MAX_BYTES (256 * 1024)
#define CONSOLE_TOKEN_HEX 64     /* session ids and CSRF tokens: 32 random bytes in hex */
#define CONSOLE_MAX_SESSIONS 64  /* the oldest login is forgotten beyond this */
#define CONSOLE_BATCH_SIZE 1000  /* rows per transaction of a retry or delete of many rows */
#define CONSOLE_DEAD_LIMIT_DEFAULT 100
#define CONSOLE_DEAD_LIMIT_MAX 10000
#define CONSOLE_JOB_IDS_MAX 10000

/* A login: the cookie value and the CSRF token the pages of that login carry. */
struct console_session {
    char id[CONSOLE_TOKEN_HEX + 1];
    char csrf[CONSOLE_TOKEN_HEX + 1];
    int64_t created; /* for replacing the oldest; 0: free slot */
};

/* The server's state: options, database connection, logins. */
struct console {
    const char *database_url;
    char *token; /* NULL: no --auth-token-file, loopback only, no login */
    bool allow_actions;
    PGconn *conn;        /* NULL or broken: reconnect at the next request */
    char db_error[OUTBOX_ERROR_MESSAGE_MAX]; /* why the database is unavailable; "" when it is up */
    struct console_session sessions[CONSOLE_MAX_SESSIONS];
    struct console_session anonymous; /* without a token: the one CSRF token of every page */
    int64_t session_counter;
};

/* How a request proved who it is. */
enum console_identity {
    CONSOLE_NOBODY,    /* no valid credential (only with a token) */
    CONSOLE_ANONYMOUS, /* no token configured: loopback, anyone local */
    CONSOLE_BEARER,    /* Authorization: Bearer with the token (exempt from CSRF) */
    CONSOLE_COOKIE,    /* the login cookie of a session */
};

struct console_request {
    char method[8];
    char path[512];    /* without the query, not decoded */
    char query[2048];  /* after '?', not decoded; "" when none */
    const char *authorization;
    const char *cookie;
    const char *csrf_header; /* X-CSRF-Token */
    const char *content_type;
    const char *body;
    size_t body_len;
    char peer[64];
    enum console_identity identity;
    struct console_session *session; /* CONSOLE_COOKIE, or &anonymous */
    char who[96];                    /* for the action log */
};

struct console_response {
    int status;
    const char *content_type;
    struct buffer body;
    struct buffer headers; /* extra header lines, each ending in \r\n */
};

/* ---- console.c ---- */

/* Runs `outboxctl serve`: argv holds the options after "serve". Returns the exit code. */
int console_serve(const char *database_url, int argc, char **argv);

/*
 * Returns the connection, reconnecting when needed; NULL when the database
 * is unavailable (console->db_error says why).
 */
PGconn *console_database(struct console *console);

/* Notes a failed query: a lost connection makes the next request reconnect. */
void console_database_failed(struct console *console, const struct outbox_error *err);

/* Decodes parameter name of a query or form body into out; false when absent. */
bool console_param(const char *params, size_t length, const char *name, char *out, size_t size);

/* Sets a plain one-line answer. */
void console_respond_text(struct console_response *response, int status, const char *text);

/* ---- console_auth.c ---- */

/* Reads the token file (first line, at least 16 characters); 0 or -1 after a message. */
int console_auth_load(struct console *console, const char *path);

/* Fills request->identity, ->session and ->who from its headers. */
void console_auth_identify(struct console *console, struct console_request *request);

/* True when the CSRF token of request (header, or csrf form field) matches its session. */
bool console_auth_csrf_ok(const struct console_request *request, const char *form_csrf);

/* Checks a submitted token and opens a session; NULL when it does not match. */
struct console_session *console_auth_login(struct console *console, const char *token);

/* Forgets the session of request. */
void console_auth_logout(struct console *console, struct console_request *request);

/* Constant-time comparison of two NUL-terminated strings. */
bool console_auth_equal(const char *a, const char *b);

/* Fills out with size - 1 random hex digits; -1 when no randomness is available. */
int console_auth_random_hex(char *out, size_t size);

/* ---- console_api.c ---- */

/* Answers a request under /api/v1/ (path without that prefix). */
void console_api(struct console *console, const struct console_request *request,
                 const char *path, struct console_response *response);

/* Writes text as a JSON string (with <, > and & as \u escapes). NULL writes null. */
void console_json_string(struct buffer *out, const char *text);

/* ---- console_html.c ---- */

/* Answers a page request (GET /, /dead, /keys, /replay, /login). */
void console_html(struct console *console, const struct console_request *request,
                  struct console_response *response);

/* Writes text HTML-escaped (& < > " '). NULL writes nothing. */
void console_html_escape(struct buffer *out, const char *text);

/* ---- console_assets.c ---- */

/* The embedded /static/ files: NULL when name is not one. */
const char *console_asset(const char *name, const char **content_type);

#endif
