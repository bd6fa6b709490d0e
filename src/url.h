/*
 * url.h - parsing broker URLs.
 *
 *   amqp://user:pass@host:port/vhost   (amqps:// for TLS)
 *   redis://[:pass@]host:port[/db]     (redis://user:pass@... for Redis ACL users)
 *
 * Userinfo and vhost are percent-decoded ("/%2f" is the vhost "/"; an empty
 * path is "/"). Defaults: AMQP guest/guest on 5672 (5671 for amqps), Redis
 * port 6379 and db 0. Errors name what is wrong and never echo a password.
 */
#ifndef OUTBOX_URL_H
#define OUTBOX_URL_H

#include "outbox.h"

enum url_scheme {
    URL_AMQP,
    URL_AMQPS,
    URL_REDIS,
};

struct broker_url {
    enum url_scheme scheme;
    char *user;     /* NULL when absent (Redis) */
    char *password; /* NULL when absent */
    char *host;
    int port;
    char *vhost; /* AMQP only */
    int db;      /* Redis only */
};

/* Parses text into url (owned strings); 0, or -1 with OUTBOX_ERR_CONFIG. */
int url_parse(const char *text, struct broker_url *url, struct outbox_error *err);
void url_clear(struct broker_url *url);

/*
 * Returns a malloc'd copy of a URL or libpq conninfo with any password
 * replaced by "***", or NULL when out of memory.
 */
char *url_redact(const char *text);

#endif
