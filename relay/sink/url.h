/*
 * url.h - parsing broker URLs.
 *
 * The schemes are not listed here: each sink declares the ones it speaks
 * (struct url_scheme, see sink_internal.h) and url_parse() reads a URL by
 * the table it is given. The shared parser reads the scheme, the userinfo
 * and the endpoint list; what follows the endpoints (the path) belongs to
 * the broker, whose scheme row parses it into a struct of its own. The
 * shapes of today's sinks:
 *
 *   amqp://user:pass@host:port/vhost   (amqps:// for TLS)
 *   amqp://user:pass@h1:p1,h2:p2,h3:p3/vhost
 *   redis://[:pass@]host:port[/db]     (redis://user:pass@... for Redis ACL users)
 *   redis+sentinel://[user:pass@]s1:p1,s2:p2/MASTERNAME[/db]
 *   redis+cluster://[user:pass@]h1:p1,h2:p2,...
 *
 * The authority holds one endpoint, or for the schemes that allow it a
 * comma-separated list of up to URL_MAX_ENDPOINTS endpoints, each
 * "host[:port]" or "[ipv6][:port]"; a missing port is the scheme's default.
 * Userinfo and hosts are percent-decoded. Defaults come from the scheme
 * rows (AMQP guest/guest on 5672, 5671 for amqps; Redis port 6379,
 * Sentinel port 26379). Errors name what is wrong (an endpoint by its
 * position in the list) and never echo a password or any part of the
 * authority.
 */
#ifndef OUTBOX_URL_H
#define OUTBOX_URL_H

#include <stdbool.h>
#include <stddef.h>

#include "outbox.h"
#include "redact.h"
#include "url_check.h"

/* Most endpoints one URL may list. */
#define URL_MAX_ENDPOINTS 16

/* One scheme a sink accepts and what its URLs hold. */
struct url_scheme {
    const char *name;             /* as written before "://" */
    const char *usage;            /* its URL's shape for --broker's help ("amqps://...") */
    int default_port;             /* when an endpoint names none */
    size_t max_endpoints;         /* 1 .. URL_MAX_ENDPOINTS */
    /*
     * Reads what follows the endpoints ("" or "/...", still percent-encoded;
     * never a query) into *parsed, a struct of the broker's own that
     * path_free frees (also after a failure). NULL: the URL takes no path
     * but "/". 0, or -1 with OUTBOX_ERR_CONFIG naming what is wrong.
     */
    int (*parse_path)(const struct url_scheme *scheme, const char *path, void **parsed,
                      struct outbox_error *err);
    void (*path_free)(void *parsed);
    const char *default_user;     /* when the URL names none; NULL: none */
    const char *default_password; /* likewise */
    const char *one_endpoint_hint; /* max_endpoints 1: what to use for several, for errors */
    bool tls;                     /* the connection is TLS (amqps) */
    bool userinfo_token;          /* a userinfo without ':' is a secret token, redacted whole */
    int variant;                  /* the sink's own distinction among its schemes */
};

/* Room for url_endpoint_format's text: "[" host "]:" port and the NUL. */
#define URL_ENDPOINT_TEXT_MAX 300

struct url_endpoint {
    char *host; /* decoded, without the brackets of an IPv6 address */
    int port;   /* 1-65535, the scheme's default when the URL names none */
};

struct broker_url {
    const struct url_scheme *scheme;
    char *user;                                       /* NULL when absent (Redis) */
    char *password;                                   /* NULL when absent */
    struct url_endpoint endpoints[URL_MAX_ENDPOINTS]; /* in the URL's order */
    size_t endpoint_count;                            /* at least 1 after a parse */
    char *host;        /* endpoints[0].host (not a separate allocation) */
    int port;          /* endpoints[0].port */
    void *path;        /* the scheme's parse_path result (the broker's own); NULL: none */
};

/*
 * Parses text into url (owned strings) by the first of schemes[0..count-1]
 * whose name it starts with; expected lists them for the error of an unknown
 * scheme ("amqp, amqps or redis"). 0, or -1 with OUTBOX_ERR_CONFIG.
 */
int url_parse(const char *text, const struct url_scheme *const *schemes, size_t count,
              const char *expected, struct broker_url *url, struct outbox_error *err);
void url_clear(struct broker_url *url);

/* The decimal in [start, start+len) when it is one within [min, max] (at most 9 digits); else -1. */
long url_decimal(const char *start, size_t len, long min, long max);

/*
 * Writes "host:port" ("[host]:port" for an IPv6 address) into out, for
 * logs and metric labels; truncated to size. Returns out.
 */
char *url_endpoint_format(const struct url_endpoint *endpoint, char *out, size_t size);

#endif
