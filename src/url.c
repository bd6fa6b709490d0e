/*
 * url.c - broker URL parsing and password redaction.
 */
#include "url.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

/* Value of one hex digit, or -1. */
static int
hex_value(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Percent-decodes [start, start+len) into a new string; NULL on a bad escape. */
static char *
decode_part(const char *start, size_t len)
{
    char *out = malloc(len + 1);
    size_t n = 0;

    if (out == NULL)
        return NULL;
    for (size_t i = 0; i < len; i++) {
        if (start[i] == '%') {
            int hi, lo;

            if (i + 2 >= len) {
                free(out);
                return NULL;
            }
            hi = hex_value(start[i + 1]);
            lo = hex_value(start[i + 2]);
            if (hi < 0 || lo < 0 || (hi == 0 && lo == 0)) {
                free(out);
                return NULL;
            }
            out[n++] = (char)(hi * 16 + lo);
            i += 2;
        } else {
            out[n++] = start[i];
        }
    }
    out[n] = '\0';
    return out;
}

/* Parses a decimal in [min, max] from [start, start+len); -1 when invalid. */
static long
parse_number(const char *start, size_t len, long min, long max)
{
    long value = 0;

    if (len == 0 || len > 9)
        return -1;
    for (size_t i = 0; i < len; i++) {
        if (!isdigit((unsigned char)start[i]))
            return -1;
        value = value * 10 + (start[i] - '0');
    }
    return value < min || value > max ? -1 : value;
}

int
url_parse(const char *text, struct broker_url *url, struct outbox_error *err)
{
    const char *rest, *authority_end, *at, *host, *colon, *path;
    size_t scheme_len;

    memset(url, 0, sizeof(*url));
    if (text == NULL || text[0] == '\0')
        return outbox_error_set(err, OUTBOX_ERR_CONFIG, "broker URL is empty");

    rest = strstr(text, "://");
    if (rest == NULL)
        return outbox_error_set(err, OUTBOX_ERR_CONFIG,
                                "broker URL has no scheme: expected amqp://, amqps:// or redis://");
    scheme_len = (size_t)(rest - text);
    if (scheme_len == 4 && strncmp(text, "amqp", 4) == 0) {
        url->scheme = URL_AMQP;
        url->port = 5672;
    } else if (scheme_len == 5 && strncmp(text, "amqps", 5) == 0) {
        url->scheme = URL_AMQPS;
        url->port = 5671;
    } else if (scheme_len == 5 && strncmp(text, "redis", 5) == 0) {
        url->scheme = URL_REDIS;
        url->port = 6379;
    } else {
        return outbox_error_set(err, OUTBOX_ERR_CONFIG,
                                "unknown broker URL scheme '%.*s': expected amqp, amqps or redis",
                                (int)(scheme_len > 20 ? 20 : scheme_len), text);
    }
    rest += 3;

    authority_end = rest + strcspn(rest, "/?#");
    if (*authority_end == '?' || *authority_end == '#')
        return outbox_error_set(err, OUTBOX_ERR_CONFIG,
                                "broker URL query strings and fragments are not supported");

    /* userinfo: the last '@' before the path, so a password may hold '@' escaped or not */
    at = NULL;
    for (const char *p = rest; p < authority_end; p++)
        if (*p == '@')
            at = p;
    host = rest;
    if (at != NULL) {
        const char *sep = memchr(rest, ':', (size_t)(at - rest));

        if (sep != NULL) {
            url->password = decode_part(sep + 1, (size_t)(at - sep - 1));
            if (url->password == NULL)
                goto bad_userinfo;
            if (sep > rest) {
                url->user = decode_part(rest, (size_t)(sep - rest));
                if (url->user == NULL)
                    goto bad_userinfo;
            }
        } else if (at > rest) {
            url->user = decode_part(rest, (size_t)(at - rest));
            if (url->user == NULL)
                goto bad_userinfo;
        }
        host = at + 1;
    }

    if (*host == '[') {
        const char *close = memchr(host, ']', (size_t)(authority_end - host));

        if (close == NULL) {
            url_clear(url);
            return outbox_error_set(err, OUTBOX_ERR_CONFIG, "broker URL has an unclosed '['");
        }
        url->host = decode_part(host + 1, (size_t)(close - host - 1));
        colon = close + 1 < authority_end && close[1] == ':' ? close + 1 : NULL;
        if (colon == NULL && close + 1 != authority_end) {
            url_clear(url);
            return outbox_error_set(err, OUTBOX_ERR_CONFIG, "broker URL has junk after the host");
        }
    } else {
        colon = memchr(host, ':', (size_t)(authority_end - host));
        url->host = decode_part(host, (size_t)((colon ? colon : authority_end) - host));
    }
    if (url->host == NULL || url->host[0] == '\0') {
        url_clear(url);
        return outbox_error_set(err, OUTBOX_ERR_CONFIG, "broker URL has no host");
    }
    if (colon != NULL) {
        long port = parse_number(colon + 1, (size_t)(authority_end - colon - 1), 1, 65535);

        if (port < 0) {
            url_clear(url);
            return outbox_error_set(err, OUTBOX_ERR_CONFIG,
                                    "broker URL port must be a number from 1 to 65535");
        }
        url->port = (int)port;
    }

    path = authority_end;
    if (url->scheme == URL_REDIS) {
        if (*path == '/' && path[1] != '\0') {
            long db = parse_number(path + 1, strlen(path + 1), 0, 1000000);

            if (db < 0) {
                url_clear(url);
                return outbox_error_set(err, OUTBOX_ERR_CONFIG,
                                        "redis URL database must be a number, as in redis://host:6379/0");
            }
            url->db = (int)db;
        }
    } else {
        if (url->user == NULL)
            url->user = strdup("guest");
        if (url->password == NULL)
            url->password = strdup("guest");
        if (*path == '\0' || path[1] == '\0')
            url->vhost = strdup("/");
        else
            url->vhost = decode_part(path + 1, strlen(path + 1));
        if (url->vhost == NULL || url->user == NULL || url->password == NULL) {
            url_clear(url);
            return outbox_error_set(err, OUTBOX_ERR_CONFIG, "broker URL has a bad vhost escape");
        }
    }
    return 0;

bad_userinfo:
    url_clear(url);
    return outbox_error_set(err, OUTBOX_ERR_CONFIG, "broker URL has a bad escape in its user or password");
}

void
url_clear(struct broker_url *url)
{
    if (url == NULL)
        return;
    free(url->user);
    if (url->password != NULL) {
        memset(url->password, 0, strlen(url->password));
        free(url->password);
    }
    free(url->host);
    free(url->vhost);
    memset(url, 0, sizeof(*url));
}

/* Appends [start, start+len) to out at *n. */
static void
append(char *out, size_t *n, const char *start, size_t len)
{
    memcpy(out + *n, start, len);
    *n += len;
}

char *
url_redact(const char *text)
{
    size_t len, n = 0;
    char *out;
    const char *p;

    if (text == NULL)
        return strdup("");
    len = strlen(text);
    out = malloc(2 * len + 16); /* room for "***" replacing short passwords */
    if (out == NULL)
        return NULL;

    p = strstr(text, "://");
    if (p != NULL) {
        /* URI: scheme://user:secret@host/...?password=secret */
        const char *auth = p + 3;
        const char *auth_end = auth + strcspn(auth, "/?#");
        const char *at = NULL, *sep;

        for (const char *q = auth; q < auth_end; q++)
            if (*q == '@')
                at = q;
        sep = at ? memchr(auth, ':', (size_t)(at - auth)) : NULL;
        if (sep != NULL) {
            append(out, &n, text, (size_t)(sep + 1 - text));
            append(out, &n, "***", 3);
            p = at;
        } else {
            p = text;
        }
        while (*p != '\0') {
            if (strncmp(p, "password=", 9) == 0 && (p == text || p[-1] == '?' || p[-1] == '&')) {
                append(out, &n, p, 9);
                append(out, &n, "***", 3);
                p += 9;
                p += strcspn(p, "&#");
                continue;
            }
            out[n++] = *p++;
        }
        out[n] = '\0';
        return out;
    }

    /* conninfo: key=value pairs, values maybe single-quoted with \ escapes */
    p = text;
    while (*p != '\0') {
        if (strncmp(p, "password", 8) == 0 && (p == text || isspace((unsigned char)p[-1]))) {
            const char *q = p + 8;

            while (isspace((unsigned char)*q))
                q++;
            if (*q == '=') {
                q++;
                while (isspace((unsigned char)*q))
                    q++;
                append(out, &n, "password=***", 12);
                if (*q == '\'') {
                    q++;
                    while (*q != '\0' && *q != '\'') {
                        if (*q == '\\' && q[1] != '\0')
                            q++;
                        q++;
                    }
                    if (*q == '\'')
                        q++;
                } else {
                    while (*q != '\0' && !isspace((unsigned char)*q))
                        q++;
                }
                p = q;
                continue;
            }
        }
        out[n++] = *p++;
    }
    out[n] = '\0';
    return out;
}
