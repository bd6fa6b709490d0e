/*
 * console_html.h - the console's HTML pages, each a console_page_fn that
 * a row of the page table (console_pages.c) names; every value from the
 * database HTML-escaped where written, on the layout of console_page.h.
 */
#ifndef OUTBOX_CONSOLE_HTML_H
#define OUTBOX_CONSOLE_HTML_H

#include "console_page.h"

/* console_html.c */
console_page_fn console_dead_page;   /* GET /dead[?queue=Q&key=K&error=TEXT&limit=N] */
console_page_fn console_keys_page;   /* GET /keys: blocked and paused keys */
console_page_fn console_replay_page; /* GET /replay */
/* GET /login: the form (401 for a page asked without a login); POST /login: logs in */
console_page_fn console_login_page;
console_page_fn console_logout_page; /* POST /logout */

/* GET /: the overview of the request's database (console_html_overview.c) */
console_page_fn console_overview_page;

/* GET /databases: every database of the list (console_databases_view.c) */
console_page_fn console_databases_page;

#endif
