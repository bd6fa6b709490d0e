/*
 * console_html.h - the console's HTML pages (overview, dead rows, keys,
 * replay, login); every value from the database HTML-escaped where written.
 */
#ifndef OUTBOX_CONSOLE_HTML_H
#define OUTBOX_CONSOLE_HTML_H

#include "console_request.h"

/* Answers a page request (GET /, /dead, /keys, /replay, /login). */
void console_html(struct console *console, const struct console_request *request,
                  struct console_response *response);

/* Writes text HTML-escaped (& < > " '). NULL writes nothing. */
void console_html_escape(struct buffer *out, const char *text);

#endif
