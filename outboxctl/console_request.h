/*
 * console_request.h - what every part of the console shares: the server's
 * state, a parsed request and the response being built, query and form
 * parameters, and the database connection that survives a restart.
 *
 * The ground floor of the console: console_request.c calls no other
 * console file, so the server, access control, API and pages all stand on
 * it (and on console_databases.c, the list it chooses from). Each worker
 * thread has its own database connection, to the database of its last
 * request (another database's request reconnects it); a failed query is
 * reported through console_database_failed() so that worker's next request
 * reconnects.
 */
#ifndef OUTBOX_CONSOLE_REQUEST_H
#define OUTBOX_CONSOLE_REQUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <pthread.h>

#include <libpq-fe.h>

#include "buffer.h"
#include "console_databases.h"
#include "outbox.h"

#define CONSOLE_TOKEN_HEX 64     /* session ids and CSRF tokens: 32 random bytes in hex */
#define CONSOLE_MAX_SESSIONS 64  /* the oldest login is forgotten beyond this */
#define CONSOLE_LOGIN_FAILURES_MAX 10      /* failed logins an address may make per window */
#define CONSOLE_LOGIN_WINDOW_SECONDS 60    /* ...after which it may try again */
#define CONSOLE_LOGIN_ADDRESSES 64         /* addresses counted; beyond, the oldest is reused */
#define CONSOLE_BATCH_SIZE 1000  /* rows per transaction of a retry or delete of many rows */
#define CONSOLE_DEAD_LIMIT_DEFAULT 100
#define CONSOLE_DEAD_LIMIT_MAX 10000
#define CONSOLE_JOB_IDS_MAX 10000
#define CONSOLE_ALLOWED_HOSTS_MAX 16 /* --allow-host given at most this often */

/* A login: the cookie value and the CSRF token the pages of that login carry. */
struct console_session {
    char id[CONSOLE_TOKEN_HEX + 1];
    char csrf[CONSOLE_TOKEN_HEX + 1];
    int64_t created; /* for replacing the oldest; 0: free slot */
};

/*
 * The names a request may give in Host (and a POST in Origin): those the
 * console listens as, on its port, and the --allow-host names, on any port.
 */
struct console_hosts {
    char listen_host[260]; /* as --listen gives it, an IPv6 address in brackets; "" for all */
    char port[8];          /* the port listened on */
    bool loopback;         /* also localhost, 127.0.0.1 and [::1] */
    bool every_address;    /* listening on all interfaces: also any IP address and localhost */
    const char *allowed[CONSOLE_ALLOWED_HOSTS_MAX];
    size_t allowed_count;
};

/*
 * The server's state, shared by every worker thread: options (read-only
 * once serving), the databases (under their own lock), and the logins,
 * under sessions_lock.
 */
struct console_page; /* a row of the page table (console_page.h) */

struct console {
    struct console_databases databases; /* the list, or the one --database-url */
    const struct console_page *pages; /* the page table, for every page's header links */
    size_t page_count;
    char *token; /* NULL: no --auth-token-file, loopback only, no login */
    bool allow_actions;
    struct console_hosts hosts;
    pthread_mutex_t sessions_lock; /* guards sessions and session_counter */
    struct console_session sessions[CONSOLE_MAX_SESSIONS];
    struct console_session anonymous; /* without a token: the one CSRF token of every page */
    int64_t session_counter;
    struct {
        char peer[64];      /* the client's address; "" for a free entry */
        int64_t window_ms;  /* when its window of CONSOLE_LOGIN_WINDOW_SECONDS began */
        int failures;       /* wrong tokens in that window */
    } login_failures[CONSOLE_LOGIN_ADDRESSES]; /* under sessions_lock */
};

/* How a request proved who it is. */
enum console_identity {
    CONSOLE_NOBODY,    /* no valid credential (only with a token) */
    CONSOLE_ANONYMOUS, /* no token configured: loopback, anyone local */
    CONSOLE_BEARER,    /* Authorization: Bearer with the token (exempt from CSRF) */
    CONSOLE_COOKIE,    /* the login cookie of a session */
};

struct console_request {
    int refused;       /* the server could not read a request: 400, 408 or 413; else 0 */
    const char *refused_reason; /* why a 400, when the server knows; else NULL */
    char method[8];
    char path[512];    /* without the query, not decoded */
    char query[2048];  /* after '?', not decoded; "" when none */
    const char *authorization;
    const char *cookie;
    const char *csrf_header; /* X-CSRF-Token */
    const char *content_type;
    const char *host;   /* the Host header; NULL when none */
    const char *origin; /* the Origin header; NULL when none (not from a browser) */
    const char *body;
    size_t body_len;
    char peer[64];
    enum console_identity identity;
    bool throttled; /* gave a credential from an address past its failed logins: 429 */
    struct console_session *session; /* &session_copy (CONSOLE_COOKIE), or &anonymous */
    struct console_session session_copy; /* the login, as it was when the request came */
    char who[96];                    /* for the action log */
    char database[DATABASE_NAME_MAX]; /* the database the request works on (database=NAME) */
    char *database_url;               /* its URL, malloc'd; NULL when the list is empty */
};

struct console_response {
    int status;
    const char *content_type;
    struct buffer body;
    struct buffer headers; /* extra header lines, each ending in \r\n */
};

/*
 * Returns the calling thread's connection to the database name at url,
 * connecting when it is down or to another database; NULL when the
 * database is unavailable or url is NULL (an empty list):
 * console_database_error() says why.
 */
PGconn *console_database(const char *name, const char *url);

/* Why the calling thread's connection is unavailable; "" when it is up. */
const char *console_database_error(void);

/* Notes a failed query: a lost connection makes this thread's next request reconnect. */
void console_database_failed(const struct outbox_error *err);

/* Closes the calling thread's connection (a worker that stops). */
void console_database_close(void);

/* Decodes parameter name of a query or form body into out; false when absent. */
bool console_param(const char *params, size_t length, const char *name, char *out, size_t size);

/* Sets a plain one-line answer. */
void console_respond_text(struct console_response *response, int status, const char *text);

#endif
