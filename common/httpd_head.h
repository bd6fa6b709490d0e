/*
 * httpd_head.h - the shared HTTP server's reading of request heads, apart
 * from its connections (httpd.c): the request line "METHOD /target
 * HTTP/1.x", header lines, and a body given by one plain Content-Length.
 * Private to the server.
 */
#ifndef OUTBOX_HTTPD_HEAD_H
#define OUTBOX_HTTPD_HEAD_H

#include <stdbool.h>
#include <stddef.h>

#include "httpd.h"

/*
 * Whether the first len bytes can still begin a request: a request line
 * (method of letters, target of visible characters from '/'), then header
 * lines without control characters.
 */
bool httpd_head_plausible(const char *data, size_t len);

/* The length of the head through its blank line ("\r\n\r\n" or "\n\n"); 0 while incomplete. */
size_t httpd_head_length(const char *data, size_t len);

/*
 * Splits head (head_len bytes, NUL-terminated, kept by the caller while
 * request is used) into request's method, path, query and header lines; -1
 * when it is not "METHOD /target HTTP/1.x", a part is too long, a CR stands
 * without its LF, a header line is not "name: value" or Host comes twice
 * (then with request->refused_reason).
 */
int httpd_head_parse(char *head, size_t head_len, struct httpd_request *request);

/*
 * The body's length from the header lines [lines, end): 0, or -1 with
 * *reason when they give it any way but one plain decimal Content-Length
 * (none: no body).
 */
int httpd_head_body_length(const char *lines, const char *end, size_t *length,
                           const char **reason);

#endif
