/*
 * url.c - broker URL parsing and password redaction.
 */
#include "url.h"

#include <ctype.h>
#include <stdbool.h>
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

static size_t uri_scheme_length(const char *text);

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
    } else if (scheme_len > 0 && scheme_len <= 20 && uri_scheme_length(text) == scheme_len) {
        return outbox_error_set(err, OUTBOX_ERR_CONFIG,
                                "unknown broker URL scheme '%.*s': expected amqp, amqps or redis",
                                (int)scheme_len, text);
    } else {
        /* not a scheme name: it may hold a password or a line break, so it is not shown */
        return outbox_error_set(err, OUTBOX_ERR_CONFIG,
                                "broker URL has no valid scheme: expected amqp://, amqps:// or"
                                " redis://");
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

/*
 * Length of a URI scheme followed by "://" at the start of text
 * ([A-Za-z][A-Za-z0-9+.-]*), or 0 when text is not a URI (then it is a
 * conninfo, as libpq decides).
 */
static size_t
uri_scheme_length(const char *text)
{
    size_t len = 0;

    if (!isalpha((unsigned char)text[0]))
        return 0;
    while (isalnum((unsigned char)text[len]) || text[len] == '+' || text[len] == '.' ||
           text[len] == '-')
        len++;
    return strncmp(text + len, "://", 3) == 0 ? len : 0;
}

/* True when the query key [start, start+len), percent-decoded, is "password". */
static bool
key_is_password(const char *start, size_t len)
{
    char *key = decode_part(start, len);
    bool result = key != NULL && strcmp(key, "password") == 0;

    free(key);
    return result;
}

/*
 * Redacts a URI: the password of its userinfo and the value of every
 * "password" query parameter. libpq (postgres:// and postgresql://) ends
 * the userinfo at the first '@' before a '/', url_parse at the last '@'
 * before a '/', '?' or '#'; each form is redacted the way it is read.
 */
static void
redact_uri(const char *text, size_t scheme_len, char *out, size_t *n)
{
    const char *auth = text + scheme_len + 3, *auth_end, *at = NULL, *sep = NULL, *p, *query;
    bool libpq = (scheme_len == 8 && strncmp(text, "postgres", 8) == 0) ||
                 (scheme_len == 10 && strncmp(text, "postgresql", 10) == 0);

    if (libpq) {
        auth_end = auth + strcspn(auth, "/");
        at = memchr(auth, '@', (size_t)(auth_end - auth));
    } else {
        auth_end = auth + strcspn(auth, "/?#");
        for (const char *q = auth; q < auth_end; q++)
            if (*q == '@')
                at = q;
    }
    if (at != NULL)
        sep = memchr(auth, ':', (size_t)(at - auth));
    if (sep != NULL) {
        append(out, n, text, (size_t)(sep + 1 - text));
        append(out, n, "***", 3);
        p = at;
    } else {
        p = at != NULL ? at : auth;
        append(out, n, text, (size_t)(p - text));
    }
    /* the query, from the first '?' on: key=value separated by '&', keys maybe percent-encoded */
    query = strchr(p, '?');
    while (*p != '\0') {
        if (query != NULL && p > query && (p[-1] == '?' || p[-1] == '&')) {
            size_t key_len = strcspn(p, "=&");

            if (p[key_len] == '=' && key_is_password(p, key_len)) {
                append(out, n, p, key_len + 1);
                append(out, n, "***", 3);
                p += key_len + 1;
                p += strcspn(p, "&");
                continue;
            }
        }
        out[(*n)++] = *p++;
    }
}

/*
 * Redacts a libpq conninfo, read as libpq reads it: keyword, optional
 * spaces, '=', optional spaces, a value either single-quoted or up to the
 * next space, with backslash escapes in both forms.
 */
static void
redact_conninfo(const char *text, char *out, size_t *n)
{
    const char *p = text;

    while (*p != '\0') {
        const char *key = p, *value;
        size_t key_len;

        if (isspace((unsigned char)*p)) {
            out[(*n)++] = *p++;
            continue;
        }
        while (*p != '\0' && *p != '=' && !isspace((unsigned char)*p))
            p++;
        key_len = (size_t)(p - key);
        while (isspace((unsigned char)*p))
            p++;
        if (*p != '=') {
            append(out, n, key, (size_t)(p - key)); /* not a keyword=value: libpq rejects it */
            continue;
        }
        p++;
        while (isspace((unsigned char)*p))
            p++;
        append(out, n, key, (size_t)(p - key));
        value = p;
        if (*p == '\'') {
            p++;
            while (*p != '\0' && *p != '\'') {
                if (*p == '\\' && p[1] != '\0')
                    p++;
                p++;
            }
            if (*p == '\'')
                p++;
        } else {
            while (*p != '\0' && !isspace((unsigned char)*p)) {
                if (*p == '\\' && p[1] != '\0')
                    p++;
                p++;
            }
        }
        if (key_len == 8 && strncmp(key, "password", 8) == 0) {
            append(out, n, "***", 3);
            /* a quoted value may touch the next keyword; "***" unquoted must not */
            if (*p != '\0' && !isspace((unsigned char)*p))
                out[(*n)++] = ' ';
        } else
            append(out, n, value, (size_t)(p - value));
    }
}

char *
url_redact(const char *text)
{
    size_t len, n = 0, scheme_len;
    char *out;

    if (text == NULL)
        return strdup("");
    len = strlen(text);
    /* "***" replaces passwords of any length, even empty ones after "password=" or ":" */
    out = malloc(2 * len + 16);
    if (out == NULL)
        return NULL;
    scheme_len = uri_scheme_length(text);
    if (scheme_len > 0)
        redact_uri(text, scheme_len, out, &n);
    else
        redact_conninfo(text, out, &n);
    out[n] = '\0';
    return out;
}
