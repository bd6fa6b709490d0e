/*
 * url.c - broker URL parsing and password redaction.
 */
#include "url.h"

#include <ctype.h>
#include <stdbool.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <libpq-fe.h>

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

/*
 * End of the endpoint that starts at start: the next ',' outside an IPv6
 * address's brackets, or end.
 */
static const char *
endpoint_end(const char *start, const char *end)
{
    const char *p = start, *comma;

    if (p < end && *p == '[') {
        const char *close = memchr(p, ']', (size_t)(end - p));

        if (close == NULL)
            return end;
        p = close;
    }
    comma = memchr(p, ',', (size_t)(end - p));
    return comma != NULL ? comma : end;
}

/*
 * Parses one endpoint [start, end): "host", "host:port", "[v6]" or
 * "[v6]:port". where is "" for a lone endpoint, else " (endpoint N)": a
 * message names the position, never the text, which may be a mistyped
 * password.
 */
static int
parse_endpoint(const char *start, const char *end, int default_port, const char *where,
               struct url_endpoint *endpoint, struct outbox_error *err)
{
    const char *colon;

    if (start == end)
        return outbox_error_set(err, OUTBOX_ERR_CONFIG,
                                where[0] != '\0' ? "broker URL lists an empty endpoint%s"
                                                  : "broker URL has no host%s",
                                where);
    if (*start == '[') {
        const char *close = memchr(start, ']', (size_t)(end - start));

        if (close == NULL)
            return outbox_error_set(err, OUTBOX_ERR_CONFIG, "broker URL has an unclosed '['%s",
                                    where);
        colon = close + 1 < end && close[1] == ':' ? close + 1 : NULL;
        if (colon == NULL && close + 1 != end)
            return outbox_error_set(err, OUTBOX_ERR_CONFIG, "broker URL has junk after the host%s",
                                    where);
        endpoint->host = decode_part(start + 1, (size_t)(close - start - 1));
    } else {
        colon = memchr(start, ':', (size_t)(end - start));
        endpoint->host = decode_part(start, (size_t)((colon ? colon : end) - start));
    }
    if (endpoint->host == NULL)
        return outbox_error_set(err, OUTBOX_ERR_CONFIG, "broker URL has a bad escape in a host%s",
                                where);
    if (endpoint->host[0] == '\0')
        return outbox_error_set(err, OUTBOX_ERR_CONFIG, "broker URL has no host%s", where);
    endpoint->port = default_port;
    if (colon != NULL) {
        long port = parse_number(colon + 1, (size_t)(end - colon - 1), 1, 65535);

        if (port < 0)
            return outbox_error_set(err, OUTBOX_ERR_CONFIG,
                                    "broker URL port must be a number from 1 to 65535%s", where);
        endpoint->port = (int)port;
    }
    return 0;
}

/*
 * Parses the endpoint list [start, end) into url->endpoints, at most
 * rule->max_endpoints of them.
 */
static int
parse_endpoints(const char *start, const char *end, const struct url_scheme *rule,
                struct broker_url *url, struct outbox_error *err)
{
    bool is_list = memchr(start, ',', (size_t)(end - start)) != NULL;
    const char *p = start;

    for (;;) {
        const char *stop = endpoint_end(p, end);
        char where[32] = "";

        if (url->endpoint_count == rule->max_endpoints) {
            size_t listed = 1;

            for (const char *q = start; q < end; q++)
                listed += *q == ',';
            if (rule->max_endpoints == 1)
                return outbox_error_set(err, OUTBOX_ERR_CONFIG, "%s:// takes one endpoint%s%s",
                                        rule->name, rule->one_endpoint_hint ? ": " : "",
                                        rule->one_endpoint_hint ? rule->one_endpoint_hint : "");
            return outbox_error_set(err, OUTBOX_ERR_CONFIG,
                                    "broker URL lists %zu endpoints: at most %zu", listed,
                                    rule->max_endpoints);
        }
        if (is_list)
            snprintf(where, sizeof(where), " (endpoint %zu)", url->endpoint_count + 1);
        if (parse_endpoint(p, stop, rule->default_port, where, &url->endpoints[url->endpoint_count],
                           err) != 0)
            return -1;
        url->endpoint_count++;
        if (stop == end)
            break;
        p = stop + 1;
    }
    url->host = url->endpoints[0].host;
    url->port = url->endpoints[0].port;
    return 0;
}

/* Parses a Sentinel path "/MASTERNAME[/db]" into url. */
static int
parse_master_db_path(const char *path, struct broker_url *url, struct outbox_error *err)
{
    const char *scheme = url->scheme->name;
    int port = url->scheme->default_port;
    const char *name = path + (*path == '/'), *slash = strchr(name, '/');
    size_t name_len = slash != NULL ? (size_t)(slash - name) : strlen(name);

    if (name_len == 0)
        return outbox_error_set(err, OUTBOX_ERR_CONFIG,
                                "%s URL needs the master name, as in %s://host:%d/mymaster",
                                scheme, scheme, port);
    url->master_name = decode_part(name, name_len);
    if (url->master_name == NULL)
        return outbox_error_set(err, OUTBOX_ERR_CONFIG, "%s URL has a bad escape in the master name",
                                scheme);
    if (slash != NULL && slash[1] != '\0') {
        long db = parse_number(slash + 1, strlen(slash + 1), 0, 1000000);

        if (db < 0)
            return outbox_error_set(err, OUTBOX_ERR_CONFIG,
                                    "%s URL database must be a number, as in"
                                    " %s://host:%d/mymaster/0",
                                    scheme, scheme, port);
        url->db = (int)db;
    }
    return 0;
}

/*
 * Parses the userinfo of the authority [rest, authority_end) into url and
 * sets *host to where the endpoints start. The last '@' before the path
 * ends it, so a password may hold '@' escaped or not.
 */
static int
parse_userinfo(const char *rest, const char *authority_end, struct broker_url *url,
               const char **host, struct outbox_error *err)
{
    const char *at = NULL, *sep;

    for (const char *p = rest; p < authority_end; p++)
        if (*p == '@')
            at = p;
    *host = rest;
    if (at == NULL)
        return 0;
    *host = at + 1;
    sep = memchr(rest, ':', (size_t)(at - rest));
    if (sep != NULL) {
        url->password = decode_part(sep + 1, (size_t)(at - sep - 1));
        if (url->password == NULL)
            goto bad;
    }
    if ((sep != NULL ? sep : at) > rest) {
        url->user = decode_part(rest, (size_t)((sep != NULL ? sep : at) - rest));
        if (url->user == NULL)
            goto bad;
    }
    return 0;

bad:
    return outbox_error_set(err, OUTBOX_ERR_CONFIG, "broker URL has a bad escape in its user or password");
}

/* Parses what follows the endpoints, by the scheme's path kind, into url. */
static int
parse_path(const struct url_scheme *rule, const char *path, struct broker_url *url,
           struct outbox_error *err)
{
    switch (rule->path) {
    case URL_PATH_DB:
        if (*path == '/' && path[1] != '\0') {
            long db = parse_number(path + 1, strlen(path + 1), 0, 1000000);

            if (db < 0) {
                return outbox_error_set(err, OUTBOX_ERR_CONFIG,
                                        "%s URL database must be a number, as in %s://host:%d/0",
                                        rule->name, rule->name, rule->default_port);
            }
            url->db = (int)db;
        }
        break;
    case URL_PATH_MASTER_DB:
        if (parse_master_db_path(path, url, err) != 0)
            return -1;
        break;
    case URL_PATH_NONE:
        if (*path == '/' && path[1] != '\0') {
            outbox_error_set(err, OUTBOX_ERR_CONFIG, "%s URL takes no database: only database 0 is served",
                             rule->name);
            return -1;
        }
        break;
    case URL_PATH_VHOST:
        if (*path == '\0' || path[1] == '\0')
            url->vhost = strdup("/");
        else
            url->vhost = decode_part(path + 1, strlen(path + 1));
        if (url->vhost == NULL) {
            outbox_error_set(err, OUTBOX_ERR_CONFIG, "broker URL has a bad vhost escape");
            return -1;
        }
        break;
    }
    return 0;
}

int
url_parse(const char *text, const struct url_scheme *const *schemes, size_t count,
          const char *expected, struct broker_url *url, struct outbox_error *err)
{
    const struct url_scheme *rule = NULL;
    const char *rest, *authority_end, *host;
    size_t scheme_len;

    memset(url, 0, sizeof(*url));
    if (text == NULL || text[0] == '\0')
        return outbox_error_set(err, OUTBOX_ERR_CONFIG, "broker URL is empty");

    rest = strstr(text, "://");
    if (rest == NULL)
        return outbox_error_set(err, OUTBOX_ERR_CONFIG, "broker URL has no scheme: expected %s",
                                expected);
    scheme_len = (size_t)(rest - text);
    for (size_t i = 0; i < count && rule == NULL; i++)
        if (strlen(schemes[i]->name) == scheme_len &&
            strncmp(text, schemes[i]->name, scheme_len) == 0)
            rule = schemes[i];
    if (rule == NULL) {
        if (scheme_len > 0 && scheme_len <= 20 && uri_scheme_length(text) == scheme_len)
            return outbox_error_set(err, OUTBOX_ERR_CONFIG,
                                    "unknown broker URL scheme '%.*s': expected %s",
                                    (int)scheme_len, text, expected);
        /* not a scheme name: it may hold a password or a line break, so it is not shown */
        return outbox_error_set(err, OUTBOX_ERR_CONFIG,
                                "broker URL has no valid scheme: expected %s", expected);
    }
    url->scheme = rule;
    rest += 3;

    authority_end = rest + strcspn(rest, "/?#");
    if (*authority_end == '?' || *authority_end == '#')
        return outbox_error_set(err, OUTBOX_ERR_CONFIG,
                                "broker URL query strings and fragments are not supported");

    if (parse_userinfo(rest, authority_end, url, &host, err) != 0 ||
        parse_endpoints(host, authority_end, rule, url, err) != 0 ||
        parse_path(rule, authority_end, url, err) != 0)
        goto fail;
    if ((url->user == NULL && rule->default_user != NULL &&
         (url->user = strdup(rule->default_user)) == NULL) ||
        (url->password == NULL && rule->default_password != NULL &&
         (url->password = strdup(rule->default_password)) == NULL)) {
        outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
        goto fail;
    }
    return 0;

fail:
    url_clear(url);
    return -1;
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
    for (size_t i = 0; i < URL_MAX_ENDPOINTS; i++)
        free(url->endpoints[i].host);
    free(url->vhost);
    free(url->master_name);
    memset(url, 0, sizeof(*url));
}

char *
url_endpoint_format(const struct url_endpoint *endpoint, char *out, size_t size)
{
    bool bracket = endpoint->host != NULL && strchr(endpoint->host, ':') != NULL;

    snprintf(out, size, "%s%s%s:%d", bracket ? "[" : "", endpoint->host ? endpoint->host : "",
             bracket ? "]" : "", endpoint->port);
    return out;
}

/* Appends [start, start+len) to out at *n. */
static void
append(char *out, size_t *n, const char *start, size_t len)
{
    memcpy(out + *n, start, len);
    *n += len;
}

/* True for the NATS schemes, where a userinfo without ':' is a token. */
static bool
nats_token_scheme(const char *text, size_t scheme_len)
{
    return (scheme_len == 4 && strncmp(text, "nats", 4) == 0) ||
           (scheme_len == 3 && strncmp(text, "tls", 3) == 0);
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
    if (at != NULL && sep == NULL && nats_token_scheme(text, scheme_len)) {
        /* nats://token@host: the whole userinfo is the secret */
        append(out, n, text, (size_t)(auth - text));
        append(out, n, "***", 3);
        p = at;
    } else if (sep != NULL) {
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

/* ---- passwords in messages -------------------------------------------------- */

/* Passwords a message about one URL or conninfo may quote, whole or in pieces. */
#define SECRETS_MAX 32

struct secrets {
    char *whole[SECRETS_MAX];  /* replaced wherever they appear */
    size_t whole_count;
    char *pieces[SECRETS_MAX]; /* parts of a password libpq may quote alone: replaced in quotes */
    size_t piece_count;
    bool overflow; /* more than fit: every quoted piece of the message is replaced */
};

static void
secrets_add(char **list, size_t *count, bool *overflow, const char *start, size_t len)
{
    if (len == 0)
        return;
    if (*count == SECRETS_MAX) {
        *overflow = true;
        return;
    }
    list[*count] = strndup(start, len);
    if (list[*count] == NULL)
        *overflow = true;
    else
        (*count)++;
}

/* Adds a password as written, percent-decoded when decode, and its pieces between @ / : ? */
static void
secrets_add_password(struct secrets *s, const char *start, size_t len, bool decode)
{
    secrets_add(s->whole, &s->whole_count, &s->overflow, start, len);
    if (decode) {
        char *decoded = decode_part(start, len);

        if (decoded != NULL)
            secrets_add(s->whole, &s->whole_count, &s->overflow, decoded, strlen(decoded));
        free(decoded);
    }
    for (size_t i = 0; i < len;) {
        size_t piece = strcspn(start + i, "@/:?&");

        if (piece > len - i)
            piece = len - i;
        if (piece < len)
            secrets_add(s->pieces, &s->piece_count, &s->overflow, start + i, piece);
        i += piece + 1;
    }
}

static void secrets_collect(struct secrets *s, const char *text, int depth);

/*
 * A dbname holding '=' or a URI is read by libpq as a whole conninfo of its
 * own (expand_dbname): its passwords count too.
 */
static void
secrets_collect_dbname(struct secrets *s, const char *value, int depth)
{
    if (depth < 2 && (strchr(value, '=') != NULL || uri_scheme_length(value) > 0))
        secrets_collect(s, value, depth + 1);
}

/*
 * The userinfo password of a URI, read three ways, since a password may hold
 * '@', '/' or '?': up to the first '@' before the first '/' (libpq), up to
 * the last '@' before '/', '?' or '#' (url_parse), and up to the last '@' of
 * all. Then every password (and dbname) of the query.
 */
static void
secrets_collect_uri(struct secrets *s, const char *text, size_t scheme_len, int depth)
{
    const char *auth = text + scheme_len + 3, *query;
    const char *ends[3] = {NULL, NULL, NULL};
    const char *slash = auth + strcspn(auth, "/"), *stop = auth + strcspn(auth, "/?#");

    ends[0] = memchr(auth, '@', (size_t)(slash - auth));
    for (const char *p = auth; p < stop; p++)
        if (*p == '@')
            ends[1] = p;
    ends[2] = strrchr(auth, '@');
    for (int i = 0; i < 3; i++) {
        const char *colon = ends[i] ? memchr(auth, ':', (size_t)(ends[i] - auth)) : NULL;

        if (colon != NULL)
            secrets_add_password(s, colon + 1, (size_t)(ends[i] - colon - 1), true);
    }
    query = strchr(auth, '?');
    for (const char *p = query; p != NULL && *p != '\0';) {
        size_t param = strcspn(++p, "&"), key = strcspn(p, "=&");

        if (key < param) {
            char *name = decode_part(p, key);

            if (name != NULL && strcmp(name, "password") == 0) {
                secrets_add_password(s, p + key + 1, param - key - 1, true);
            } else if (name != NULL && strcmp(name, "dbname") == 0) {
                char *value = decode_part(p + key + 1, param - key - 1);

                if (value != NULL)
                    secrets_collect_dbname(s, value, depth);
                free(value);
            }
            free(name);
        }
        p += param;
    }
}

/* Each keyword = value of a conninfo, read as libpq reads it (see redact_conninfo). */
static void
secrets_collect_conninfo(struct secrets *s, const char *text, int depth)
{
    const char *p = text;

    while (*p != '\0') {
        const char *key, *value;
        size_t key_len;
        char *plain;
        size_t n = 0;

        while (isspace((unsigned char)*p))
            p++;
        key = p;
        while (*p != '\0' && *p != '=' && !isspace((unsigned char)*p))
            p++;
        key_len = (size_t)(p - key);
        while (isspace((unsigned char)*p))
            p++;
        if (*p != '=') {
            if (*p != '\0' && p == key)
                p++;
            continue;
        }
        p++;
        while (isspace((unsigned char)*p))
            p++;
        value = p;
        plain = malloc(strlen(p) + 1);
        if (plain == NULL) {
            s->overflow = true;
            return;
        }
        if (*p == '\'') {
            for (p++; *p != '\0' && *p != '\''; p++) {
                if (*p == '\\' && p[1] != '\0')
                    p++;
                plain[n++] = *p;
            }
            if (*p == '\'')
                p++;
        } else {
            for (; *p != '\0' && !isspace((unsigned char)*p); p++) {
                if (*p == '\\' && p[1] != '\0')
                    p++;
                plain[n++] = *p;
            }
        }
        plain[n] = '\0';
        if (key_len == 8 && strncmp(key, "password", 8) == 0) {
            secrets_add(s->whole, &s->whole_count, &s->overflow, value, (size_t)(p - value));
            secrets_add_password(s, plain, n, false);
        } else if (key_len == 6 && strncmp(key, "dbname", 6) == 0) {
            secrets_collect_dbname(s, plain, depth);
        }
        free(plain);
    }
}

static void
secrets_collect(struct secrets *s, const char *text, int depth)
{
    size_t scheme_len = uri_scheme_length(text);

    if (scheme_len > 0)
        secrets_collect_uri(s, text, scheme_len, depth);
    else
        secrets_collect_conninfo(s, text, depth);
}

static void
secrets_clear(struct secrets *s)
{
    for (size_t i = 0; i < s->whole_count; i++) {
        memset(s->whole[i], 0, strlen(s->whole[i]));
        free(s->whole[i]);
    }
    for (size_t i = 0; i < s->piece_count; i++) {
        memset(s->pieces[i], 0, strlen(s->pieces[i]));
        free(s->pieces[i]);
    }
}

/* Longest first, so a password is never half replaced by a shorter one inside it. */
static int
compare_longest_first(const void *a, const void *b)
{
    size_t x = strlen(*(char *const *)a), y = strlen(*(char *const *)b);

    return (x < y) - (x > y);
}

/*
 * Replaces in [start, end) of text every occurrence of the secrets with
 * "***", appending to out; or the whole range when all is set.
 */
static void
replace_secrets(const char *start, const char *end, char *const *list, size_t count, bool all,
                char *out, size_t *n)
{
    if (all) {
        append(out, n, "***", 3);
        return;
    }
    while (start < end) {
        size_t i;

        for (i = 0; i < count; i++) {
            size_t len = strlen(list[i]);

            if (len <= (size_t)(end - start) && memcmp(start, list[i], len) == 0)
                break;
        }
        if (i < count) {
            append(out, n, "***", 3);
            start += strlen(list[i]);
        } else {
            out[(*n)++] = *start++;
        }
    }
}

/* True when p starts "password", any case, then optional spaces and '='; *value after it. */
static bool
password_keyword_at(const char *text, const char *p, const char **value)
{
    if (strncasecmp(p, "password", 8) != 0)
        return false;
    if (p > text && (isalnum((unsigned char)p[-1]) || p[-1] == '_'))
        return false;
    p += 8;
    while (*p == ' ')
        p++;
    if (*p != '=')
        return false;
    p++;
    while (*p == ' ')
        p++;
    *value = p;
    return true;
}

/*
 * The patterns any message may hold without our knowing the URL: the
 * userinfo password of a URI (scheme://user:password@), and the value of
 * "password=" as a conninfo keyword or a URI query parameter, quoted or not.
 */
static void
redact_patterns(const char *text, char *out, size_t *n)
{
    const char *p = text;

    while (*p != '\0') {
        const char *value;

        if (strncmp(p, "://", 3) == 0) {
            const char *auth = p + 3, *end = auth + strcspn(auth, " \t\n\"'"), *at = NULL;
            const char *colon;

            for (const char *q = auth; q < end; q++)
                if (*q == '@')
                    at = q;
            colon = at ? memchr(auth, ':', (size_t)(at - auth)) : NULL;
            append(out, n, p, 3);
            if (colon != NULL) {
                append(out, n, auth, (size_t)(colon + 1 - auth));
                append(out, n, "***", 3);
                p = at;
            } else {
                p = auth;
            }
            continue;
        }
        if (password_keyword_at(text, p, &value)) {
            append(out, n, p, (size_t)(value - p));
            append(out, n, "***", 3);
            p = value;
            if (*p == '\'') {
                for (p++; *p != '\0' && *p != '\''; p++)
                    if (*p == '\\' && p[1] != '\0')
                        p++;
                if (*p == '\'')
                    p++;
            } else {
                while (*p != '\0' && !isspace((unsigned char)*p) && strchr("&\"',;)", *p) == NULL)
                    p++;
            }
            continue;
        }
        out[(*n)++] = *p++;
    }
}

void
url_redact_message(const char *message, const char *source, const char *password, char *out,
                   size_t size)
{
    struct secrets s = {0};
    const char *env = getenv("PGPASSWORD");
    size_t len, n = 0, m = 0;
    char *first = NULL, *second = NULL, *third = NULL;

    if (size == 0)
        return;
    if (message == NULL)
        message = "";
    if (source != NULL)
        secrets_collect(&s, source, 0);
    if (password != NULL)
        secrets_add(s.whole, &s.whole_count, &s.overflow, password, strlen(password));
    if (env != NULL)
        secrets_add(s.whole, &s.whole_count, &s.overflow, env, strlen(env));
    qsort(s.whole, s.whole_count, sizeof(*s.whole), compare_longest_first);
    qsort(s.pieces, s.piece_count, sizeof(*s.pieces), compare_longest_first);

    /* each step at most doubles the text plus a little ("***" for anything, even one byte) */
    len = strlen(message);
    first = malloc(3 * len + 16);
    second = malloc(9 * len + 48);
    if (first == NULL || second == NULL) {
        snprintf(out, size, "(message withheld: out of memory)");
        goto done;
    }
    replace_secrets(message, message + len, s.whole, s.whole_count, false, first, &n);
    first[n] = '\0';
    /* libpq quotes what it could not read between double quotes: pieces of a password too */
    for (const char *p = first; *p != '\0';) {
        const char *close = *p == '"' ? strchr(p + 1, '"') : NULL;

        if (close == NULL) {
            second[m++] = *p++;
            continue;
        }
        second[m++] = '"';
        replace_secrets(p + 1, close, s.pieces, s.piece_count, s.overflow, second, &m);
        second[m++] = '"';
        p = close + 1;
    }
    second[m] = '\0';
    /* a pattern adds "***" to at least five bytes ("://:@") */
    third = malloc(2 * m + 16);
    if (third == NULL) {
        snprintf(out, size, "(message withheld: out of memory)");
        goto done;
    }
    n = 0;
    redact_patterns(second, third, &n);
    third[n] = '\0';
    snprintf(out, size, "%s", third);
done:
    free(first);
    free(second);
    free(third);
    secrets_clear(&s);
}

/* Parses one conninfo or URI with libpq; 0, or -1 with its reason redacted. */
static int
check_conninfo(const char *text, const char *whole, struct outbox_error *err)
{
    char *reason = NULL, redacted[OUTBOX_ERROR_MESSAGE_MAX];
    PQconninfoOption *options = PQconninfoParse(text, &reason);
    int rc = 0;

    if (options == NULL) {
        url_redact_message(reason != NULL ? reason : "out of memory", whole, NULL, redacted,
                           sizeof(redacted));
        redacted[strcspn(redacted, "\n")] = '\0';
        PQfreemem(reason);
        return outbox_error_set(err, OUTBOX_ERR_CONFIG, "not a valid libpq URI or conninfo: %s",
                                redacted);
    }
    for (PQconninfoOption *option = options; option->keyword != NULL; option++) {
        const char *value = option->val;

        /* libpq reads a dbname holding '=' or a URI as a conninfo of its own */
        if (strcmp(option->keyword, "dbname") == 0 && value != NULL && value != text &&
            (strchr(value, '=') != NULL || uri_scheme_length(value) > 0) &&
            strcmp(value, text) != 0) {
            rc = check_conninfo(value, whole, err);
            break;
        }
    }
    PQconninfoFree(options);
    return rc;
}

int
url_check_database(const char *text, struct outbox_error *err)
{
    if (text == NULL || text[0] == '\0')
        return outbox_error_set(err, OUTBOX_ERR_CONFIG, "the database URL is empty");
    return check_conninfo(text, text, err);
}
