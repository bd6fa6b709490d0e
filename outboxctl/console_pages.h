/*
 * console_pages.h - the console's one page table: each HTML page a row
 * (path, title, handler, header link), from which the console routes a
 * page request and every page draws its header. How to add a page: its
 * handler (a console_page_fn, console_html.h) and its row in
 * console_pages.c; nothing else changes.
 */
#ifndef OUTBOX_CONSOLE_PAGES_H
#define OUTBOX_CONSOLE_PAGES_H

#include "console_page.h"

extern const struct console_page console_pages[];
extern const size_t console_page_count;

/*
 * Answers a page request from the table: the login form (401) for a request
 * without a login but to an open page, 404 for a path no row has, the
 * banner (503) when a page's database is away.
 */
void console_html(struct console *console, struct console_request *request,
                  struct console_response *response);

#endif
