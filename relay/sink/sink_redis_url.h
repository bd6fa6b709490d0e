/*
 * sink_redis_url.h - the Redis URL path rules: which topology a scheme asks
 * for, and the database and master name a path names.
 *
 * The registry row of sink_redis.c points at these; the nodes read the
 * database and the sentinels the master name from here. Calls nothing of
 * the sink.
 */
#ifndef OUTBOX_SINK_REDIS_URL_H
#define OUTBOX_SINK_REDIS_URL_H

#include "url.h"

/* What the URL scheme asks for. */
enum topology {
    TOPOLOGY_SINGLE,   /* redis://: one server */
    TOPOLOGY_SENTINEL, /* redis+sentinel://: the primary the sentinels name */
    TOPOLOGY_CLUSTER,  /* redis+cluster://: the masters of a Redis Cluster */
};

/* redis://: "[/db]"; redis+sentinel://: "/MASTERNAME[/db]"; redis+cluster://: nothing. */
int sink_redis_parse_path(const struct url_scheme *scheme, const char *text, void **parsed,
                          struct outbox_error *err);

/* Frees what sink_redis_parse_path() made; NULL is a no-op. */
void sink_redis_path_free(void *parsed);

/* The database of a parsed redis:// or redis+sentinel:// URL ("/N"), 0 when none is named. */
int sink_redis_url_db(const struct broker_url *url);

/* The master name of a parsed redis+sentinel:// URL, owned by url; NULL for another scheme. */
const char *sink_redis_url_master(const struct broker_url *url);

#endif
