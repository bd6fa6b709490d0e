/*
 * ctl_databases.c - outboxctl --databases FILE COMMAND: the command run on
 * each database of a relay's list in turn, each under a heading, then a
 * totals line; the exit status is the worst one.
 */
#include <stdio.h>
#include <string.h>

#include "ctl.h"
#include "database_list.h"

/*
 * Commands that make no sense repeated over every database of a list (serve
 * takes the list whole: outboxctl.c never brings it here).
 */
static const char *const REFUSED[] = {"enqueue", "stream", "identity set"};

/* Whether argv[i..] names a refused command. */
static const char *
refused_command(int argc, char **argv, int i)
{
    for (size_t r = 0; r < sizeof(REFUSED) / sizeof(REFUSED[0]); r++) {
        const char *name = REFUSED[r], *space = strchr(name, ' ');

        if (space == NULL && strcmp(argv[i], name) == 0)
            return name;
        if (space != NULL && strncmp(argv[i], name, (size_t)(space - name)) == 0 &&
            argv[i][space - name] == '\0' && i + 1 < argc && strcmp(argv[i + 1], space + 1) == 0)
            return name;
    }
    return NULL;
}

int
ctl_run_over_databases(struct ctl *ctl, int argc, char **argv, int i, ctl_command_fn *dispatch)
{
    struct database_list list;
    struct outbox_error err;
    const char *refused = refused_command(argc, argv, i);
    int worst = 0, failed = 0;

    if (refused != NULL)
        return ctl_usage_error("--databases: '%s' runs on one database; use --database-url",
                               refused);
    if (database_list_read(ctl->databases_file, &list, &err) != 0)
        return ctl_usage_error("%s", err.message);
    for (size_t d = 0; d < list.count; d++) {
        int rc;

        printf("%s== database %s\n", d > 0 ? "\n" : "", list.items[d].name);
        fflush(stdout);
        ctl->database_url = list.items[d].url;
        PQfinish(ctl->conn);
        ctl->conn = NULL;
        rc = dispatch(ctl, argc, argv, i);
        fflush(stdout);
        fflush(stderr);
        if (rc == EXIT_USAGE) { /* the same mistake on every database: say it once */
            worst = rc;
            failed = (int)(list.count - d);
            break;
        }
        failed += rc != 0;
        worst = rc > worst ? rc : worst;
    }
    PQfinish(ctl->conn);
    ctl->conn = NULL;
    ctl->database_url = NULL;
    printf("\ndatabases: %zu, ok: %zu, failed: %d\n", list.count, list.count - (size_t)failed,
           failed);
    database_list_clear(&list);
    return worst;
}
