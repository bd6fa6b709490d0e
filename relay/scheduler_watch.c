/*
 * scheduler_watch.c - one connection per PostgreSQL server of a list,
 * reading pg_stat_database for the databases whose rows changed. See
 * scheduler_watch.h.
 */
#include "scheduler_watch.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "buffer.h"
#include "log.h"
#include "pg_bounded.h"
#include "timeouts.h"

struct watch_database {
    char *name;     /* in the list */
    char *dbname;   /* in pg_stat_database */
    size_t server;  /* index in servers */
    int64_t changed; /* rows inserted, updated and deleted */
    bool seen;       /* changed holds a count of the last look */
};

struct watch_server {
    char *key; /* the connection options but the database's */
    char *url; /* the first database's URL: any database of the server will do */
    PGconn *conn;
    double retry_at;
    double retry_wait; /* after a failed connect, doubling; 0 until one failed */
    bool answered;     /* its last look succeeded */
    char *members; /* the relays' watch sessions at the last look, NULL before one */
};

struct watch {
    char name[WATCH_NAME_MAX]; /* this relay's sessions' application_name */
    char stale_after[16];      /* seconds: a session querying no more is another member */
    struct watch_database *databases;
    size_t count;
    struct watch_server *servers;
    size_t server_count;
    struct watch_wake *woken;
};

struct watch *
scheduler_watch_new(const char *name, int stale_seconds)
{
    struct watch *w = calloc(1, sizeof(struct watch));

    if (w != NULL) {
        snprintf(w->name, sizeof(w->name), "%s", name);
        snprintf(w->stale_after, sizeof(w->stale_after), "%d", stale_seconds);
    }
    return w;
}

static void
close_server(struct watch_server *server, watch_give_fn give, void *arg)
{
    if (server->conn != NULL) {
        PQfinish(server->conn);
        server->conn = NULL;
        give(arg);
    }
    server->answered = false;
    free(server->members);
    server->members = NULL;
}

static void
free_databases(struct watch_database *databases, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        free(databases[i].name);
        free(databases[i].dbname);
    }
    free(databases);
}

static void
clear(struct watch *w)
{
    free_databases(w->databases, w->count);
    free(w->woken);
    w->databases = NULL;
    w->woken = NULL;
    w->count = 0;
}

/*
 * Gives each database of w the count its namesake of old (same name,
 * database and server) had: a commit between the last look before a list
 * change and the first after it moves the count from the old one, and
 * wakes its database, instead of being taken for where the count starts.
 */
static void
carry_counts(struct watch *w, const struct watch_database *old, size_t old_count)
{
    for (size_t d = 0; d < w->count; d++)
        for (size_t o = 0; o < old_count; o++)
            if (old[o].seen && old[o].server == w->databases[d].server &&
                strcmp(old[o].name, w->databases[d].name) == 0 &&
                strcmp(old[o].dbname, w->databases[d].dbname) == 0) {
                w->databases[d].changed = old[o].changed;
                w->databases[d].seen = true;
            }
}

void
scheduler_watch_free(struct watch *w, watch_give_fn give, void *arg)
{
    if (w == NULL)
        return;
    for (size_t i = 0; i < w->server_count; i++) {
        close_server(&w->servers[i], give, arg);
        free(w->servers[i].key);
        free(w->servers[i].url);
    }
    free(w->servers);
    clear(w);
    free(w);
}

/* Whether keyword names the database, the login or the session's name: not the server's. */
static bool
not_of_server(const char *keyword)
{
    static const char *const others[] = {"dbname", "application_name", "fallback_application_name",
                                         "user", "password", "passfile", NULL};

    for (size_t i = 0; others[i] != NULL; i++)
        if (strcmp(keyword, others[i]) == 0)
            return true;
    return false;
}

/*
 * The server of url as a key (every connection option but the database's,
 * the login's and the application name's: databases of one server under
 * a login role each share one watch, made with the first one's URL) and its
 * database name; false for a URL libpq cannot read or one without a
 * database name.
 */
static bool
watch_server_of(const char *url, struct buffer *key, char **dbname)
{
    PQconninfoOption *options = PQconninfoParse(url, NULL);

    *dbname = NULL;
    if (options == NULL)
        return false;
    for (PQconninfoOption *o = options; o->keyword != NULL; o++) {
        if (o->val == NULL || o->val[0] == '\0')
            continue;
        if (strcmp(o->keyword, "dbname") == 0)
            *dbname = strdup(o->val);
        else if (!not_of_server(o->keyword))
            buffer_printf(key, "%s=%s\n", o->keyword, o->val);
    }
    PQconninfoFree(options);
    return *dbname != NULL;
}

/* The index of the server of key, added with url when new; -1 out of memory. */
static long
find_server(struct watch *w, const char *key, const char *url)
{
    struct watch_server *servers;

    for (size_t i = 0; i < w->server_count; i++)
        if (strcmp(w->servers[i].key, key) == 0)
            return (long)i;
    servers = realloc(w->servers, (w->server_count + 1) * sizeof(*servers));
    if (servers == NULL)
        return -1;
    w->servers = servers;
    servers[w->server_count] = (struct watch_server){.key = strdup(key), .url = strdup(url)};
    if (servers[w->server_count].key == NULL || servers[w->server_count].url == NULL)
        return -1;
    return (long)w->server_count++;
}

/* Drops the servers no database uses any more, closing their connections. */
static void
drop_unused_servers(struct watch *w, watch_give_fn give, void *arg)
{
    size_t kept = 0;

    for (size_t i = 0; i < w->server_count; i++) {
        bool used = false;

        for (size_t d = 0; d < w->count && !used; d++)
            used = w->databases[d].server == i;
        if (!used) {
            close_server(&w->servers[i], give, arg);
            free(w->servers[i].key);
            free(w->servers[i].url);
            continue;
        }
        for (size_t d = 0; d < w->count; d++)
            if (w->databases[d].server == i)
                w->databases[d].server = kept;
        w->servers[kept++] = w->servers[i];
    }
    w->server_count = kept;
}

int
scheduler_watch_set(struct watch *w, size_t count, const char *const *names,
                    const char *const *urls, watch_give_fn give, void *arg)
{
    struct watch_database *old = w->databases;
    size_t old_count = w->count;
    int rc = 0;

    w->databases = NULL; /* kept in old until the counts are carried over */
    w->count = 0;
    clear(w);
    w->databases = calloc(count + 1, sizeof(*w->databases));
    w->woken = calloc(count + 1, sizeof(*w->woken));
    if (w->databases == NULL || w->woken == NULL)
        rc = -1;
    for (size_t i = 0; i < count && rc == 0; i++) {
        struct watch_database *d = &w->databases[w->count];
        struct buffer key = {0};
        long server;

        if (!watch_server_of(urls[i], &key, &d->dbname) || key.failed) {
            free(d->dbname); /* not watched: polled as before */
            d->dbname = NULL;
            buffer_clear(&key);
            continue;
        }
        server = find_server(w, key.data != NULL ? key.data : "", urls[i]);
        buffer_clear(&key);
        d->name = strdup(names[i]);
        if (server < 0 || d->name == NULL) {
            rc = -1;
            w->count++;
            break;
        }
        d->server = (size_t)server;
        w->count++;
    }
    if (rc != 0)
        clear(w);
    else
        carry_counts(w, old, old_count);
    free_databases(old, old_count);
    drop_unused_servers(w, give, arg);
    return rc;
}

/* Opens server's connection when due and the budget allows; false without one. */
static bool
connect_server(struct watch_server *server, const char *name, double now, watch_take_fn take,
               watch_give_fn give, void *arg)
{
    const char *keywords[] = {"dbname", "application_name", "connect_timeout", NULL};
    const char *values[] = {server->url, name, TIMEOUT_TEXT(SCHEDULER_WATCH_DEADLINE_SECONDS),
                            NULL};

    if (server->conn != NULL)
        return true;
    if (now < server->retry_at || !take(arg))
        return false;
    server->conn = PQconnectdbParams(keywords, values, 1);
    if (PQstatus(server->conn) == CONNECTION_OK) {
        server->retry_wait = 0;
        return true;
    }
    log_event(OUTBOX_LOG_DEBUG, "database watch not connected, polling instead",
              "error=\"%s\"", PQerrorMessage(server->conn));
    close_server(server, give, arg);
    server->retry_wait = server->retry_wait == 0 ? SCHEDULER_WATCH_RETRY_SECONDS
                         : server->retry_wait * 2 < SCHEDULER_WATCH_RETRY_MAX_SECONDS
                             ? server->retry_wait * 2
                             : SCHEDULER_WATCH_RETRY_MAX_SECONDS;
    server->retry_at = now + server->retry_wait;
    return false;
}

/*
 * Per database, the rows its transactions inserted, updated and deleted;
 * and the relays' watch sessions on the server, each with its login role
 * and marked when it ran no query for $1 seconds (a relay stopped). Only
 * sessions of this watch's own login role or of a member of outbox_relay
 * (sql/roles) count: any session may take a relay's watch name, and one
 * that changed its name or stopped querying in turns made every look a
 * change of members, each waking every database of the server (a wake
 * storm: PostgreSQL 30 % -> 124 % of a core). sql/020 counts such a session
 * for nothing in the leases.
 */
static const char SQL_LOOK[] =
    "SELECT d.datname, d.tup_inserted + d.tup_updated + d.tup_deleted,"
    "       (SELECT string_agg(w.member, ',' ORDER BY w.member)"
    "          FROM (SELECT a.application_name || '@' || a.usesysid"
    "                       || CASE WHEN a.query_start > now() - make_interval(secs => $1)"
    "                               THEN '' ELSE '~' END AS member"
    "                  FROM pg_stat_activity AS a"
    "                 WHERE a.application_name LIKE '" WATCH_NAME_PREFIX "%'"
    "                   AND (a.usesysid = (SELECT r.oid FROM pg_roles AS r"
    "                                       WHERE r.rolname = session_user)"
    "                        OR pg_has_role(a.usesysid, to_regrole('outbox_relay'), 'MEMBER')))"
    "               AS w)"
    "  FROM pg_stat_database AS d WHERE d.datname IS NOT NULL";

/* Adds every database of server index to w->woken from woken on, as woken by a change of members. */
static size_t
wake_server(struct watch *w, size_t index, size_t woken)
{
    for (size_t d = 0; d < w->count; d++)
        if (w->databases[d].server == index)
            w->woken[woken++] = (struct watch_wake){w->databases[d].name, true};
    return woken;
}

/* Records server's members as seen now; true when they changed since the last look. */
static bool
members_changed(struct watch_server *server, const char *members)
{
    bool changed = server->members != NULL && strcmp(server->members, members) != 0;

    if (server->members == NULL || changed) {
        free(server->members);
        server->members = strdup(members);
    }
    return changed;
}

/* Reads the row counts of server's databases; adds the moved ones to w->woken. */
static size_t
look_at_server(struct watch *w, size_t index, size_t woken)
{
    struct watch_server *server = &w->servers[index];
    const char *values[1] = {w->stale_after};
    /* bounded: one stalled server must not hold up the wakes of the others */
    PGresult *result = pg_exec_bounded(server->conn, SQL_LOOK, 1, values,
                                       SCHEDULER_WATCH_DEADLINE_SECONDS * 1000);
    size_t first = woken;

    server->answered = PQresultStatus(result) == PGRES_TUPLES_OK;
    for (int r = 0; server->answered && r < PQntuples(result); r++) {
        const char *dbname = PQgetvalue(result, r, 0);
        int64_t changed = strtoll(PQgetvalue(result, r, 1), NULL, 10);

        for (size_t d = 0; d < w->count; d++) {
            struct watch_database *db = &w->databases[d];

            if (db->server != index || strcmp(db->dbname, dbname) != 0)
                continue;
            /* first seen (listed, or its server back): what changed unseen is looked at */
            if (!db->seen || db->changed != changed)
                w->woken[woken++] = (struct watch_wake){db->name, false};
            db->changed = changed;
            db->seen = true;
        }
    }
    if (server->answered && PQntuples(result) > 0 &&
        members_changed(server, PQgetvalue(result, 0, 2)))
        woken = wake_server(w, index, first); /* every database, in place of the moved ones */
    PQclear(result);
    return woken;
}

/* Looks at server index, connected; closes its connection when it did not answer. */
static size_t
look_or_close(struct watch *w, size_t index, size_t woken, double now, watch_give_fn give,
              void *arg)
{
    struct watch_server *server = &w->servers[index];

    woken = look_at_server(w, index, woken);
    if (!server->answered) {
        log_event(OUTBOX_LOG_DEBUG, "database watch lost its server, polling instead",
                  "error=\"%s\"", PQerrorMessage(server->conn));
        close_server(server, give, arg);
        server->retry_at = now + SCHEDULER_WATCH_RETRY_SECONDS;
    }
    return woken;
}

size_t
scheduler_watch_look(struct watch *w, double now, watch_take_fn take, watch_give_fn give, void *arg,
                     const struct watch_wake **woken)
{
    size_t count = 0, retry = w->server_count;

    *woken = w->woken;
    for (size_t i = 0; i < w->server_count; i++) {
        if (w->servers[i].conn != NULL) {
            count = look_or_close(w, i, count, now, give, arg);
            continue;
        }
        for (size_t d = 0; d < w->count; d++)
            if (w->databases[d].server == i)
                w->databases[d].seen = false;
        if (retry == w->server_count || w->servers[i].retry_at < w->servers[retry].retry_at)
            retry = i;
    }
    /* one server without a connection is connected to per look, after the looks at the
     * others: a server that accepts connections and never answers holds the watch for
     * SCHEDULER_WATCH_DEADLINE_SECONDS, and ten of them held every wake for 20 s */
    if (retry < w->server_count &&
        connect_server(&w->servers[retry], w->name, now, take, give, arg))
        count = look_or_close(w, retry, count, now, give, arg);
    return count;
}

bool
scheduler_watch_covers(const struct watch *w, const char *name)
{
    for (size_t d = 0; d < w->count; d++)
        if (strcmp(w->databases[d].name, name) == 0)
            return w->databases[d].seen && w->servers[w->databases[d].server].answered;
    return false;
}

int
watch_pid_of(const struct watch *w, const char *name)
{
    for (size_t d = 0; d < w->count; d++)
        if (strcmp(w->databases[d].name, name) == 0) {
            const struct watch_server *server = &w->servers[w->databases[d].server];

            return server->conn != NULL ? PQbackendPID(server->conn) : 0;
        }
    return 0;
}
