/*
 * console.h - the operator's console behind `outboxctl serve`: a small
 * HTTP/1.1 server (console.c routes; the programs' shared server, common/httpd.c,
 * holds the connections), access control (console_auth.c), the JSON API
 * under /api/v1/ (console_api.c), the HTML pages (console_html.c), their
 * embedded stylesheet and script (console_assets.c), all standing on the
 * shared state, parameters and database connection (console_request.c).
 *
 * One thread reads requests and writes answers without blocking, a few
 * workers answer them, each on its own database connection: an operator's
 * page, not a data path, that no slow client can hold up. Every answer
 * closes its connection.
 * Every value from the database is escaped where it is written (HTML or
 * JSON); the pages load no script or style but the console's own, under a
 * Content-Security-Policy of default-src 'self'.
 */
#ifndef OUTBOX_CONSOLE_H
#define OUTBOX_CONSOLE_H

#include "timeouts.h"

#define CONSOLE_DEFAULT_LISTEN "127.0.0.1:8080"
#define CONSOLE_REQUEST_MAX_BYTES (256 * 1024)
#define CONSOLE_WORKERS 4            /* threads building answers, a database connection each */
#define CONSOLE_MAX_CONNECTIONS 128  /* connections open at once */
/* CONSOLE_REQUEST_SECONDS and CONSOLE_ANSWER_SECONDS: timeouts.h */

/*
 * Runs `outboxctl serve`: argv holds the options after "serve"; the console
 * serves the list of databases_file (outboxctl --databases FILE serve) or,
 * when that is NULL, the one database_url. Returns the exit code.
 */
int console_serve(const char *database_url, const char *databases_file, int argc, char **argv);

#endif
