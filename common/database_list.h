/*
 * database_list.h - the list of databases a relay serves and outboxctl runs over (--databases FILE).
 *
 * One database a line, "NAME URL" or a bare URL (named by its database
 * name); blank lines and comments are skipped: a '#' at a line's start or
 * after a blank, outside a conninfo value in single quotes, starts one (a
 * '#' within a word, as in a URL's password, is the word's). A name is 1-63
 * characters of [A-Za-z0-9_.-] and is what log lines (database=NAME),
 * metrics (database="NAME") and /healthz call the database. The file is
 * read whole or not at all: a bad line, a name or URL twice, is an error
 * naming the line, and the list in use stays as it was. Errors never quote
 * a URL (it may hold a password).
 */
#ifndef OUTBOX_DATABASE_LIST_H
#define OUTBOX_DATABASE_LIST_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>
#include <time.h>

#include "outbox.h"

#define DATABASE_NAME_MAX 64 /* with its NUL */

struct database_entry {
    char name[DATABASE_NAME_MAX];
    char *url;
};

struct database_list {
    struct database_entry *items;
    size_t count;
};

/*
 * Parses the text of a list (source names it in errors: "--databases
 * FILE"). 0, or -1 with OUTBOX_ERR_CONFIG naming the line; out is then
 * empty. Clear out with database_list_clear().
 */
int database_list_parse(const char *text, const char *source, struct database_list *out,
                        struct outbox_error *err);

/*
 * Reads and parses the file at path; as database_list_parse(), and refused
 * (OUTBOX_ERR_CONFIG) when it lists no database or its last line has no
 * newline at its end: a file cut short, or read while written in place,
 * mostly ends within a line, which alone may read as another database. A
 * file cut at a line's end cannot be told from a shorter list: write the
 * list to a new file and rename it over the old one.
 */
int database_list_read(const char *path, struct database_list *out, struct outbox_error *err);

/* Frees the entries; clearing an empty list is a no-op. */
void database_list_clear(struct database_list *list);

/* Copies from into to (to is cleared first); -1 when out of memory, to then empty. */
int database_list_copy(const struct database_list *from, struct database_list *to);

/*
 * A list of the one database of url (--database-url), named by its
 * database name, or "default" when that is not a valid name; -1 when out
 * of memory.
 */
int database_list_single(const char *url, struct database_list *out);

/* The entry called name, or NULL. */
const struct database_entry *database_list_find(const struct database_list *list,
                                                const char *name);

/* What a file looked like when last read: a change of any of these means read it again. */
struct database_file_stamp {
    bool exists;
    struct timespec mtime;
    off_t size;
    ino_t inode;
};

/* Stamps path now (exists false when it cannot be stat'ed). */
struct database_file_stamp database_file_stamp(const char *path);

/* True when the two stamps differ. */
bool database_file_changed(const struct database_file_stamp *a,
                           const struct database_file_stamp *b);

#endif
