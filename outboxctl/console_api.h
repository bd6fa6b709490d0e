/*
 * console_api.h - the console's JSON API under /api/v1/: every value from
 * the database written as an escaped JSON string.
 */
#ifndef OUTBOX_CONSOLE_API_H
#define OUTBOX_CONSOLE_API_H

#include "console_request.h"

/* Answers a request under /api/v1/ (path without that prefix). */
void console_api(struct console *console, const struct console_request *request,
                 const char *path, struct console_response *response);

/* Writes text as a JSON string (with <, > and & as \u escapes). NULL writes null. */
void console_json_string(struct buffer *out, const char *text);

#endif
