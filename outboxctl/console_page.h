/*
 * console_page.h - the layout every page of the console shares
 * (console_page.c), and the shape of the page table's rows: each page is
 * one row of console_pages.c (path, title, handler, header link), which
 * routes to it and puts it in every page's header.
 */
#ifndef OUTBOX_CONSOLE_PAGE_H
#define OUTBOX_CONSOLE_PAGE_H

#include <stdbool.h>
#include <stddef.h>

#include <libpq-fe.h>

#include "console_request.h"

/*
 * A page's handler: answers response (an HTML body and a status). conn is
 * the worker's connection to the request's database for a page whose row
 * says database, else NULL.
 */
typedef void console_page_fn(struct console *console, PGconn *conn,
                             struct console_request *request, struct console_response *response);

struct console_page {
    const char *path;      /* "/dead" */
    const char *title;     /* the banner's title when its database is away */
    const char *nav;       /* the header's link text; NULL: no link (login, logout) */
    bool database;         /* needs the request's database (the banner answers when it is away) */
    bool open;             /* served without a login (the login form, logging out) */
    console_page_fn *show; /* its handler, in the page's module */
};

/* Writes text HTML-escaped (& < > " '). NULL writes nothing. */
void console_html_escape(struct buffer *out, const char *text);

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

#endif
