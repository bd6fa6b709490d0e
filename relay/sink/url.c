/*
 * url.c - broker URL parsing.
 */
#include "url.h"

#include <ctype.h>
#include <stdbool.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "error.h"

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
        endpoint->host = url_percent_decode(start + 1, (size_t)(close - start - 1));
    } else {
        colon = memchr(start, ':', (size_t)(end - start));
        endpoint->host = url_percent_decode(start, (size_t)((colon ? colon : end) - start));
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
        url->password = url_percent_decode(sep + 1, (size_t)(at - sep - 1));
        if (url->password == NULL)
            goto bad;
    }
    if ((sep != NULL ? sep : at) > rest) {
        url->user = url_percent_decode(rest, (size_t)((sep != NULL ? sep : at) - rest));
        if (url->user == NULL)
            goto bad;
    }
    return 0;

bad:
    return outbox_error_set(err, OUTBOX_ERR_CONFIG, "broker URL has a bad escape in its user or password");
}

/* Hands what follows the endpoints to the scheme's own path rules. */
static int
parse_path(const struct url_scheme *rule, const char *path, struct broker_url *url,
           struct outbox_error *err)
{
    if (rule->parse_path != NULL)
        return rule->parse_path(rule, path, &url->path, err);
    if (*path == '/' && path[1] != '\0')
        return outbox_error_set(err, OUTBOX_ERR_CONFIG, "%s URL takes no path", rule->name);
    return 0;
}

long
url_decimal(const char *start, size_t len, long min, long max)
{
    return parse_number(start, len, min, max);
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
        if (scheme_len > 0 && scheme_len <= 20 && url_scheme_length(text) == scheme_len)
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
    if (url->path != NULL && url->scheme != NULL && url->scheme->path_free != NULL)
        url->scheme->path_free(url->path);
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
