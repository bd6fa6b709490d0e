/*
 * console_html.h - the console's HTML pages (overview, dead rows, keys,
 * replay, databases, login); every value from the database HTML-escaped
 * where written. console_html.c holds the layout every page shares and
 * routes to the pages; a page of its own file (console_html_overview.c,
 * console_databases_view.c) builds on the layout below.
 */
#ifndef OUTBOX_CONSOLE_HTML_H
#define OUTBOX_CONSOLE_HTML_H

#include <stdbool.h>
#include <stddef.h>

#include <libpq-fe.h>

#include "console_request.h"

/* Answers a page request (GET /, /dead, /keys, /replay, /databases, /login). */
void console_html(struct console *console, const struct console_request *request,
                  struct console_response *response);

/* Writes text HTML-escaped (& < > " '). NULL writes nothing. */
void console_html_escape(struct buffer *out, const char *text);

/* ---- the layout (console_html.c) ---- */

/* Opens a page: head, the header's links (carrying the request's database) and <main>. */
void console_page_start(struct console *console, const struct console_request *request,
                        struct buffer *out, const char *title, const char *current);
void console_page_end(struct buffer *out);
/* Ends an HTML answer with status. */
void console_page_respond(struct console_response *response, int status);
/* Answers 503 with the page's banner saying its database is away. */
void console_page_banner(struct console *console, const struct console_request *request,
                         struct console_response *response, const char *title, const char *current,
                         const char *message);

/*
 * Writes separator ('?', or '&' as "&amp;" for an attribute) and
 * "database=NAME", the request's database, for a link or a form's
 * target; nothing when it has none.
 */
void console_html_database_param(struct buffer *out, const struct console_request *request,
                                 char separator);

/*
 * Opens a table under an <h2> title with the NULL-terminated column heads;
 * false (after the empty note) when rows is 0: then write no row.
 */
bool console_table_open(struct buffer *out, const char *title, size_t rows, const char *empty,
                        const char *id, const char *const columns[]);

/* ---- pages of their own files ---- */

/* GET /: the overview of the request's database (console_html_overview.c). */
void console_overview_page(struct console *console, PGconn *conn,
                           const struct console_request *request,
                           struct console_response *response);

/* GET /databases: every database of the list (console_databases_view.c). */
void console_databases_page(struct console *console, const struct console_request *request,
                            struct console_response *response);

#endif
