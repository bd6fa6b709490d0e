/*
 * httpd_head.c - reading a request's head for the shared HTTP server: how
 * it starts, where it ends, its request line and headers, its body length
 * (see httpd_head.h).
 */
#include "httpd_head.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/*
 * Whether the first len bytes can still begin a request: a request line
 * "METHOD /target HTTP/1.x" (method of letters, target of visible
 * characters from '/'), then header lines without control characters.
 */
bool
httpd_head_plausible(const char *data, size_t len)
{
    static const char version[] = "HTTP/1.";
    size_t i = 0, start;

    for (start = i; i < len && data[i] != ' '; i++)
        if (!((data[i] >= 'A' && data[i] <= 'Z') || (data[i] >= 'a' && data[i] <= 'z')) ||
            i - start >= 16)
            return false;
    if (i == len)
        return true;
    if (i == start)
        return false;
    i++; /* the space */
    for (start = i; i < len && data[i] != ' '; i++)
        if ((unsigned char)data[i] <= 0x20 || (unsigned char)data[i] >= 0x7f ||
            (i == start && data[i] != '/'))
            return false;
    if (i == len)
        return true;
    if (i == start)
        return false;
    i++;
    for (start = i; i < len && i - start < sizeof(version) - 1; i++)
        if (data[i] != version[i - start])
            return false;
    if (i == len)
        return true;
    if (data[i] < '0' || data[i] > '9')
        return false;
    i++;
    if (i < len && data[i] == '\r')
        i++;
    if (i < len && data[i] != '\n')
        return false;
    for (; i < len; i++)
        if (((unsigned char)data[i] < 0x20 && data[i] != '\t' && data[i] != '\r' &&
             data[i] != '\n') ||
            data[i] == 0x7f)
            return false;
    return true;
}

/* Finds header name (case-insensitive) among the NUL-separated lines [lines, end). */
static const char *
find_header(const char *lines, const char *end, const char *name)
{
    size_t name_len = strlen(name);

    for (const char *line = lines; line != NULL && line < end; line += strlen(line) + 1) {
        if (strncasecmp(line, name, name_len) == 0 && line[name_len] == ':') {
            const char *value = line + name_len + 1;

            while (*value == ' ' || *value == '\t')
                value++;
            return value;
        }
    }
    return NULL;
}

const char *
httpd_request_header(const struct httpd_request *request, const char *name)
{
    return find_header(request->lines, request->lines_end, name);
}

/* The length of the head through its blank line ("\r\n\r\n" or "\n\n"); 0 while incomplete. */
size_t
httpd_head_length(const char *data, size_t len)
{
    const char *crlf = memmem(data, len, "\r\n\r\n", 4), *lf = memmem(data, len, "\n\n", 2);

    if (crlf != NULL && (lf == NULL || crlf < lf))
        return (size_t)(crlf - data) + 4;
    return lf != NULL ? (size_t)(lf - data) + 2 : 0;
}

/*
 * Whether the header lines of head (CR and LF already NULs) are each a
 * "name: value" and name Host at most once; else *reason. A line folded
 * onto the one before, or a second Host, would be read one way here and
 * another by a proxy in front.
 */
static bool
header_lines_valid(const char *lines, const char *end, const char **reason)
{
    int hosts = 0;

    for (const char *line = lines; line < end; line += strlen(line) + 1) {
        if (line[0] == '\0')
            continue;
        if (line[0] == ' ' || line[0] == '\t' || strchr(line, ':') == NULL ||
            strchr(line, ':') == line) {
            *reason = "malformed header line";
            return false;
        }
        if (strncasecmp(line, "Host:", 5) == 0 && ++hosts > 1) {
            *reason = "more than one Host header";
            return false;
        }
    }
    return true;
}

/*
 * Splits the request line and headers of head (head_len bytes, owned by the
 * request from now on) into request; -1 when it is not "METHOD /target
 * HTTP/1.x", a part is too long, a CR stands without its LF or a header
 * line is malformed (then with request->refused_reason).
 */
int
httpd_head_parse(char *head, size_t head_len, struct httpd_request *request)
{
    char *end = head + head_len, *line_end, *target, *version, *query;

    for (char *p = head; p < end; p++) {
        if (*p == '\r' && (p + 1 == end || p[1] != '\n')) {
            request->refused_reason = "a CR without its LF in the request head";
            return -1;
        }
    }
    for (char *p = head; p < end; p++)
        if (*p == '\r' || *p == '\n')
            *p = '\0';
    line_end = head + strlen(head);
    while (line_end < end && *line_end == '\0')
        line_end++;
    request->lines = line_end;
    request->lines_end = end;
    if (!header_lines_valid(line_end, end, &request->refused_reason))
        return -1;
    if ((target = strchr(head, ' ')) == NULL)
        return -1;
    *target++ = '\0';
    version = strchr(target, ' ');
    if (version == NULL || strncmp(version + 1, "HTTP/1.", 7) != 0 || strchr(version + 1, ' '))
        return -1;
    *version = '\0';
    if (strlen(head) >= sizeof(request->method) || target[0] != '/')
        return -1;
    snprintf(request->method, sizeof(request->method), "%s", head);
    target[strcspn(target, "#")] = '\0';
    if ((query = strchr(target, '?')) != NULL) {
        *query++ = '\0';
        if (strlen(query) >= sizeof(request->query))
            return -1;
        snprintf(request->query, sizeof(request->query), "%s", query);
    }
    if (strlen(target) >= sizeof(request->path))
        return -1;
    snprintf(request->path, sizeof(request->path), "%s", target);
    return 0;
}

/*
 * Reads the body's length from the head lines [lines, end) into *length:
 * 0, or -1 with *reason when the head gives it in any way but one plain
 * decimal Content-Length (or none: no body).
 */
int
httpd_head_body_length(const char *lines, const char *end, size_t *length, const char **reason)
{
    const char *value = find_header(lines, end, "Content-Length");
    size_t digits;

    *length = 0;
    if (find_header(lines, end, "Transfer-Encoding") != NULL) {
        *reason = "Transfer-Encoding is not supported: send the body with a Content-Length";
        return -1;
    }
    if (value == NULL)
        return 0;
    digits = strspn(value, "0123456789");
    if (digits == 0 || digits > 9 || strspn(value + digits, " \t") != strlen(value + digits)) {
        *reason = "bad Content-Length: one decimal number of bytes expected";
        return -1;
    }
    if (find_header(value + strlen(value) + 1, end, "Content-Length") != NULL) {
        *reason = "bad Content-Length: given more than once";
        return -1;
    }
    *length = (size_t)strtoul(value, NULL, 10);
    return 0;
}

