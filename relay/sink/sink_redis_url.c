/*
 * sink_redis_url.c - the path rules of redis://, redis+sentinel:// and
 * redis+cluster:// URLs: a database number, a master name, or nothing.
 *
 * Rules: pure parsing of what url.c hands over; calls nothing of the sink,
 * so every file of the Redis sink may read the parsed path.
 */
#include "sink_redis_url.h"

#include <stdlib.h>
#include <string.h>

#include "error.h"

/* What a Redis URL's path names. */
struct sink_redis_url_path {
    char *master_name; /* redis+sentinel://: required */
    int db;            /* 0 when none is named; always 0 in a cluster */
};

void
sink_redis_path_free(void *parsed)
{
    struct sink_redis_url_path *path = parsed;

    if (path != NULL)
        free(path->master_name);
    free(path);
}

/* "/N" into path->db; -1 with an error naming example when N is no database number. */
static int
parse_db(const struct url_scheme *scheme, const char *text, const char *example,
         struct sink_redis_url_path *path, struct outbox_error *err)
{
    long db = url_decimal(text, strlen(text), 0, 1000000);

    if (db < 0)
        return outbox_error_set(err, OUTBOX_ERR_CONFIG,
                                "%s URL database must be a number, as in %s://host:%d/%s",
                                scheme->name, scheme->name, scheme->default_port, example);
    path->db = (int)db;
    return 0;
}

/* A Sentinel path "/MASTERNAME[/db]". */
static int
parse_master_db(const struct url_scheme *scheme, const char *text,
                struct sink_redis_url_path *path, struct outbox_error *err)
{
    const char *name = text + (*text == '/'), *slash = strchr(name, '/');
    size_t name_len = slash != NULL ? (size_t)(slash - name) : strlen(name);

    if (name_len == 0)
        return outbox_error_set(err, OUTBOX_ERR_CONFIG,
                                "%s URL needs the master name, as in %s://host:%d/mymaster",
                                scheme->name, scheme->name, scheme->default_port);
    path->master_name = url_percent_decode(name, name_len);
    if (path->master_name == NULL)
        return outbox_error_set(err, OUTBOX_ERR_CONFIG,
                                "%s URL has a bad escape in the master name", scheme->name);
    if (slash != NULL && slash[1] != '\0')
        return parse_db(scheme, slash + 1, "mymaster/0", path, err);
    return 0;
}

int
sink_redis_parse_path(const struct url_scheme *scheme, const char *text, void **parsed,
                      struct outbox_error *err)
{
    struct sink_redis_url_path *path = calloc(1, sizeof(*path));

    if (path == NULL)
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    *parsed = path;
    switch ((enum topology)scheme->variant) {
    case TOPOLOGY_SINGLE:
        return *text == '/' && text[1] != '\0' ? parse_db(scheme, text + 1, "0", path, err) : 0;
    case TOPOLOGY_SENTINEL:
        return parse_master_db(scheme, text, path, err);
    case TOPOLOGY_CLUSTER:
        if (*text == '/' && text[1] != '\0')
            return outbox_error_set(err, OUTBOX_ERR_CONFIG,
                                    "%s URL takes no database: only database 0 is served",
                                    scheme->name);
        return 0;
    }
    return 0;
}

int
sink_redis_url_db(const struct broker_url *url)
{
    if (url->scheme == NULL || url->scheme->parse_path != sink_redis_parse_path || url->path == NULL)
        return 0;
    return ((const struct sink_redis_url_path *)url->path)->db;
}

const char *
sink_redis_url_master(const struct broker_url *url)
{
    if (url->scheme == NULL || url->scheme->parse_path != sink_redis_parse_path || url->path == NULL)
        return NULL;
    return ((const struct sink_redis_url_path *)url->path)->master_name;
}
