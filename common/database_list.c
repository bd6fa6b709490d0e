/*
 * database_list.c - the --databases list: parsing, and the stamp that says
 * when the file changed.
 */
#include "database_list.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <libpq-fe.h>

#include "error.h"
#include "url_check.h"

/* The longest list file read. */
#define LIST_FILE_MAX (4 * 1024 * 1024)

static bool
name_valid(const char *name, size_t len)
{
    if (len == 0 || len >= DATABASE_NAME_MAX)
        return false;
    for (size_t i = 0; i < len; i++)
        if (!isalnum((unsigned char)name[i]) && name[i] != '_' && name[i] != '.' &&
            name[i] != '-')
            return false;
    return true;
}

/* The dbname a URL or conninfo names, into out; -1 when it names none. */
static int
name_of_url(const char *url, char *out, size_t size)
{
    char *message = NULL;
    PQconninfoOption *options = PQconninfoParse(url, &message);
    int rc = -1;

    PQfreemem(message);
    for (PQconninfoOption *o = options; o != NULL && o->keyword != NULL; o++)
        if (strcmp(o->keyword, "dbname") == 0 && o->val != NULL && o->val[0] != '\0' &&
            strlen(o->val) < size) {
            snprintf(out, size, "%s", o->val);
            rc = 0;
        }
    PQconninfoFree(options);
    return rc;
}

/* Appends one entry; -1 when out of memory. */
static int
list_add(struct database_list *list, const char *name, const char *url, size_t url_len)
{
    struct database_entry *items = realloc(list->items, (list->count + 1) * sizeof(*items));

    if (items == NULL)
        return -1;
    list->items = items;
    snprintf(items[list->count].name, DATABASE_NAME_MAX, "%s", name);
    items[list->count].url = strndup(url, url_len);
    if (items[list->count].url == NULL)
        return -1;
    list->count++;
    return 0;
}

/*
 * libpq's reason a URL was refused, into out, with every quoted text left
 * out: it quotes the values it could not read, and a line cut or mistyped
 * in a password makes the password a port, a host or an option.
 */
static void
hide_quoted(const char *reason, char *out, size_t size)
{
    size_t n = 0;
    bool quoted = false;

    for (const char *c = reason; *c != '\0' && n + 6 < size; c++) {
        if (*c == '"') {
            quoted = !quoted;
            if (quoted) {
                memcpy(out + n, "\"...\"", strlen("\"...\""));
                n += strlen("\"...\"");
            }
        } else if (!quoted) {
            out[n++] = *c;
        }
    }
    out[n] = '\0';
}

/* Parses one line (comment and blanks trimmed, not empty) into list. */
static int
parse_line(const char *line, size_t len, const char *source, int number, struct database_list *list,
           struct outbox_error *err)
{
    size_t first = 0, rest;
    char name[DATABASE_NAME_MAX] = "";
    struct outbox_error inner;
    const char *url;
    size_t url_len;
    char *copy;
    int rc;

    while (first < len && !isspace((unsigned char)line[first]))
        first++;
    rest = first;
    while (rest < len && isspace((unsigned char)line[rest]))
        rest++;
    if (rest < len) { /* NAME URL */
        if (!name_valid(line, first))
            return outbox_error_set(err, OUTBOX_ERR_CONFIG,
                                    "%s line %d: the name must be 1-63 characters of A-Z a-z 0-9"
                                    " _ . -",
                                    source, number);
        memcpy(name, line, first);
        name[first] = '\0';
        url = line + rest;
        url_len = len - rest;
    } else { /* a bare URL */
        url = line;
        url_len = len;
    }
    copy = strndup(url, url_len);
    if (copy == NULL)
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    rc = url_check_database(copy, &inner);
    if (rc != 0) {
        char reason[OUTBOX_ERROR_MESSAGE_MAX];

        hide_quoted(inner.message, reason, sizeof(reason));
        outbox_error_set(err, OUTBOX_ERR_CONFIG, "%s line %d: %s", source, number, reason);
    }
    else if (name[0] == '\0' &&
             (name_of_url(copy, name, sizeof(name)) != 0 || !name_valid(name, strlen(name))))
        rc = outbox_error_set(err, OUTBOX_ERR_CONFIG,
                              "%s line %d: the URL names no database usable as a name;"
                              " write 'NAME URL'",
                              source, number);
    for (size_t i = 0; rc == 0 && i < list->count; i++)
        if (strcmp(list->items[i].name, name) == 0 || strcmp(list->items[i].url, copy) == 0)
            rc = outbox_error_set(err, OUTBOX_ERR_CONFIG, "%s line %d: %s '%s' is listed twice",
                                  source, number,
                                  strcmp(list->items[i].name, name) == 0 ? "the name"
                                                                         : "the URL of",
                                  list->items[i].name);
    if (rc == 0 && list_add(list, name, copy, strlen(copy)) != 0)
        rc = outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    free(copy);
    return rc;
}

/*
 * Where the comment of a line of len bytes starts (len: none): a '#' at
 * the line's start or after a blank, outside a conninfo value in single
 * quotes. A '#' inside a word (a password "S3cr#AB" in a URL) is the word's.
 */
static size_t
comment_start(const char *line, size_t len)
{
    bool quoted = false;

    for (size_t i = 0; i < len; i++) {
        if (quoted && line[i] == '\\' && i + 1 < len)
            i++;
        else if (line[i] == '\'')
            quoted = !quoted;
        else if (!quoted && line[i] == '#' && (i == 0 || isspace((unsigned char)line[i - 1])))
            return i;
    }
    return len;
}

int
database_list_parse(const char *text, const char *source, struct database_list *out,
                    struct outbox_error *err)
{
    int number = 0;

    memset(out, 0, sizeof(*out));
    for (const char *p = text; *p != '\0';) {
        size_t len = strcspn(p, "\n"), end = comment_start(p, len), start = 0;

        number++;
        while (start < end && isspace((unsigned char)p[start]))
            start++;
        while (end > start && isspace((unsigned char)p[end - 1]))
            end--;
        if (end > start && parse_line(p + start, end - start, source, number, out, err) != 0) {
            database_list_clear(out);
            return -1;
        }
        p += len + (p[len] == '\n');
    }
    return 0;
}

int
database_list_read(const char *path, struct database_list *out, struct outbox_error *err)
{
    char source[256];
    FILE *file = fopen(path, "r");
    char *text;
    size_t len;
    int rc;

    memset(out, 0, sizeof(*out));
    snprintf(source, sizeof(source), "--databases %s", path);
    if (file == NULL)
        return outbox_error_set(err, OUTBOX_ERR_CONFIG, "%s: %s", source, strerror(errno));
    text = malloc(LIST_FILE_MAX + 1);
    if (text == NULL) {
        fclose(file);
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    }
    len = fread(text, 1, LIST_FILE_MAX + 1, file);
    rc = ferror(file);
    fclose(file);
    if (rc != 0 || len > LIST_FILE_MAX) {
        free(text);
        return outbox_error_set(err, OUTBOX_ERR_CONFIG, "%s: %s", source,
                                rc != 0 ? "unable to read" : "longer than 4 MiB");
    }
    text[len] = '\0';
    if (memchr(text, '\0', len) != NULL)
        rc = outbox_error_set(err, OUTBOX_ERR_CONFIG, "%s: holds a NUL byte", source);
    else
        rc = database_list_parse(text, source, out, err);
    if (rc == 0 && out->count == 0) /* a file emptied, or caught while rewritten in place */
        rc = outbox_error_set(err, OUTBOX_ERR_CONFIG, "%s: lists no database", source);
    /* a file cut short ends within a line, which alone may read as another database */
    if (rc == 0 && text[len - 1] != '\n') {
        database_list_clear(out);
        rc = outbox_error_set(err, OUTBOX_ERR_CONFIG,
                              "%s: its last line has no newline at its end (a file cut short,"
                              " or caught while written)",
                              source);
    }
    free(text);
    return rc;
}

void
database_list_clear(struct database_list *list)
{
    for (size_t i = 0; list != NULL && i < list->count; i++)
        free(list->items[i].url);
    if (list != NULL) {
        free(list->items);
        memset(list, 0, sizeof(*list));
    }
}

int
database_list_copy(const struct database_list *from, struct database_list *to)
{
    memset(to, 0, sizeof(*to));
    for (size_t i = 0; i < from->count; i++)
        if (list_add(to, from->items[i].name, from->items[i].url, strlen(from->items[i].url)) !=
            0) {
            database_list_clear(to);
            return -1;
        }
    return 0;
}

int
database_list_single(const char *url, struct database_list *out)
{
    char name[DATABASE_NAME_MAX];

    memset(out, 0, sizeof(*out));
    if (name_of_url(url, name, sizeof(name)) != 0 || !name_valid(name, strlen(name)))
        snprintf(name, sizeof(name), "default");
    if (list_add(out, name, url, strlen(url)) != 0) {
        database_list_clear(out);
        return -1;
    }
    return 0;
}

const struct database_entry *
database_list_find(const struct database_list *list, const char *name)
{
    for (size_t i = 0; i < list->count; i++)
        if (strcmp(list->items[i].name, name) == 0)
            return &list->items[i];
    return NULL;
}

struct database_file_stamp
database_file_stamp(const char *path)
{
    struct database_file_stamp stamp = {0};
    struct stat st;

    if (stat(path, &st) != 0)
        return stamp;
    stamp.exists = true;
    stamp.mtime = st.st_mtim;
    stamp.size = st.st_size;
    stamp.inode = st.st_ino;
    return stamp;
}

bool
database_file_changed(const struct database_file_stamp *a, const struct database_file_stamp *b)
{
    return a->exists != b->exists || a->mtime.tv_sec != b->mtime.tv_sec ||
           a->mtime.tv_nsec != b->mtime.tv_nsec || a->size != b->size || a->inode != b->inode;
}
