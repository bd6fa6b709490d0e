/*
 * store_mutants.c - the planted defects of the store's statements (mutant.h).
 *
 * Each mutant rewrites the text of a real statement of store_statements[] by
 * replacing a fragment, so it follows the statement as it changes; a fragment
 * no longer found stops the mutant relay at once with the mutant's name
 * (the gate fails loudly instead of judging the unmutated relay).
 * Empty outside the mutant build.
 */
#include "store_statements.h"

#ifdef OUTBOX_MUTANTS
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mutant.h"

/* One fragment of a statement and what the mutant puts in its place. */
struct edit {
    const char *mutant;
    enum statement statement;
    const char *from, *to;
};

#define UNFENCED(s)                                                                                \
    {"unfenced_mark", s, "j.state = 'running' AND j.worker_id = $1 AND j.attempts = input.generation", \
     "$1::text IS NOT NULL AND input.generation IS NOT NULL"},                                     \
    {"unfenced_mark", s, "AND j.lease_until > clock_timestamp()", ""}
#define KEYLESS(s)                                                                                 \
    {"claim_ignores_key", s, " AND NOT c.held", ""},                                               \
    {"claim_ignores_key", s, "(c.ordering_key IS NULL OR NOT EXISTS (", "(true OR NOT EXISTS ("},  \
    {"claim_ignores_key", s, "SET state = 'running',", "SET state = 'running', held = false,"}

static const struct edit edits[] = {
    UNFENCED(STMT_COMPLETE),
    UNFENCED(STMT_COMPLETE_DELETE),
    KEYLESS(STMT_CLAIM_ALL),
    KEYLESS(STMT_CLAIM_QUEUES),
    KEYLESS(STMT_CLAIM_ALL_PAUSED),
    KEYLESS(STMT_CLAIM_QUEUES_PAUSED),
    {"reaper_succeeded", STMT_REAP,
     "SET state = CASE WHEN j.attempts >= j.max_attempts THEN 'dead' ELSE 'ready' END",
     "SET state = 'succeeded'"},
    {"reaper_succeeded", STMT_REAP,
     "finished_at = CASE WHEN j.attempts >= j.max_attempts THEN clock_timestamp() END",
     "finished_at = clock_timestamp()"},
};

/* text with the first from replaced by to (allocated); exits when from is gone. */
static char *
replace(const char *text, const struct edit *e)
{
    const char *at = strstr(text, e->from);
    size_t head, size;
    char *out;

    if (at == NULL) {
        fprintf(stderr, "outbox mutant %s: its fragment is gone from statement %s: %s\n",
                e->mutant, store_statements[e->statement].name, e->from);
        exit(70);
    }
    head = (size_t)(at - text);
    size = strlen(text) - strlen(e->from) + strlen(e->to) + 1;
    out = malloc(size);
    if (out == NULL)
        abort();
    memcpy(out, text, head);
    snprintf(out + head, size - head, "%s%s", e->to, at + strlen(e->from));
    return out;
}

const char *
store_mutant_sql(enum statement statement, const char *sql)
{
    const char *text = sql;

    for (size_t i = 0; i < sizeof(edits) / sizeof(edits[0]); i++)
        if (edits[i].statement == statement && mutant_fires(edits[i].mutant))
            text = replace(text, &edits[i]); /* the mutant relay's statements live for ever */
    return text;
}
#else
typedef int store_mutants_unused;
#endif
