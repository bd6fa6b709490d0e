/*
 * http_client.c - the tests' one HTTP client (see http_client.h).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "fixtures.h"
#include "http_client.h"

/* The most of an answer read (the console's largest pages fit). */
#define HTTP_REPLY_MAX (4 * 1024 * 1024)

void
http_reply_free(struct http_reply *reply)
{
    free(reply->head);
    free(reply->body);
    memset(reply, 0, sizeof(*reply));
}

/* Splits what was read into status, head and body; status 0 when it is no HTTP answer. */
static struct http_reply
parse_reply(char *text)
{
    struct http_reply reply = {0};
    char *split = strstr(text, "\r\n\r\n");

    if (sscanf(text, "HTTP/1.%*d %d", &reply.status) != 1 || split == NULL)
        return (struct http_reply){0};
    reply.body = strdup(split + 4);
    *split = '\0';
    reply.head = strdup(text);
    assert_true(reply.body != NULL && reply.head != NULL);
    return reply;
}

struct http_reply
http_request(int port, const char *method, const char *path, const char *extra, const char *body,
             int timeout_seconds)
{
    struct http_reply reply = {0};
    char *request, *buffer, host[64] = "";
    size_t len = 0, body_len = body ? strlen(body) : 0;
    int fd = fixture_connect_loopback(port, timeout_seconds);

    if (fd < 0)
        return reply;
    if (extra == NULL || strncasecmp(extra, "Host:", 5) != 0)
        snprintf(host, sizeof(host), "Host: 127.0.0.1:%d\r\n", port);
    assert_true(asprintf(&request, "%s %s HTTP/1.1\r\n%s%sContent-Length: %zu\r\n\r\n%s", method,
                         path, host, extra ? extra : "", body_len, body ? body : "") > 0);
    if (write(fd, request, strlen(request)) != (ssize_t)strlen(request)) {
        free(request);
        close(fd);
        return reply;
    }
    free(request);
    buffer = malloc(HTTP_REPLY_MAX + 1);
    assert_non_null(buffer);
    for (;;) {
        ssize_t n = read(fd, buffer + len, HTTP_REPLY_MAX - len);

        if (n <= 0 || (len += (size_t)n) == HTTP_REPLY_MAX)
            break;
    }
    close(fd);
    buffer[len] = '\0';
    reply = parse_reply(buffer);
    free(buffer);
    return reply;
}

struct http_reply
http_get(int port, const char *path)
{
    return http_request(port, "GET", path, NULL, NULL, 5);
}
