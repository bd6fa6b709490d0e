/*
 * migrate.h - applying the schema migrations embedded in the library.
 *
 * The files sql/NNN_name.sql are compiled into liboutbox as C strings (see
 * sql/embed-migrations.sh) and applied in version order, each once,
 * each in its own transaction together with its row in
 *
 *   outbox.schema_migrations (version integer PRIMARY KEY, name text NOT NULL,
 *                             applied_at timestamptz NOT NULL DEFAULT now())
 *
 * so a failed file leaves nothing behind and is tried again next time. A
 * migration file must therefore not contain BEGIN/COMMIT or statements that
 * cannot run in a transaction block (CREATE INDEX CONCURRENTLY).
 *
 * Concurrent callers are serialized by a session advisory lock on
 * OUTBOX_MIGRATE_LOCK_KEY in the target database; the lock is released on
 * every path. A database whose schema_migrations already lists every
 * version (e.g. one copied from a migrated template) is left untouched.
 */
#ifndef OUTBOX_MIGRATE_H
#define OUTBOX_MIGRATE_H

#include <stddef.h>

#include "outbox.h"

/* pg_advisory_lock key of migrations: "outbox" in ASCII, 0x6f7574626f78. */
#define OUTBOX_MIGRATE_LOCK_KEY 122550254464888LL

/* One embedded migration file. */
struct migrate_file {
    int version;      /* the NNN prefix of the file name */
    const char *name; /* the file name, e.g. "001_outbox.sql" */
    const char *sql;  /* the file's text */
};

/* The embedded files in ascending version order (built from sql/). */
extern const struct migrate_file migrate_files[];
extern const size_t migrate_file_count;

/* outbox_migrate() and outbox_schema_version() are public: see outbox.h. */

/*
 * Returns 0 when the database's schema is at the highest embedded version
 * (or later), else -1 with OUTBOX_ERR_SCHEMA and "outbox schema is at
 * version N, this build needs M: run 'outboxctl migrate'" (or "outbox schema
 * not found: ..." without one). Checked first by every outboxctl command and
 * by outbox_store_connect(), so an old schema is named as such rather than
 * by the first missing column. A role that may not read
 * outbox.schema_migrations is not checked.
 */
int outbox_schema_check(PGconn *conn, struct outbox_error *err);

#endif
