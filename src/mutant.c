/*
 * mutant.c - planted defects' switch (see mutant.h). Empty outside the
 * mutant build.
 */
#include "mutant.h"

#ifdef OUTBOX_MUTANTS
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static atomic_int fired;
static atomic_uint calls;

bool
mutant_fires(const char *name)
{
    const char *wanted = getenv("OUTBOX_MUTANT");

    if (wanted == NULL || strcmp(wanted, name) != 0)
        return false;
    if (atomic_exchange(&fired, 1) == 0) {
        fprintf(stderr, "outbox mutant %s fired\n", name);
        fflush(stderr);
    }
    return true;
}

bool
mutant_fires_every(const char *name, unsigned every)
{
    const char *wanted = getenv("OUTBOX_MUTANT");

    if (wanted == NULL || strcmp(wanted, name) != 0)
        return false;
    return (atomic_fetch_add(&calls, 1) + 1) % every == 0 && mutant_fires(name);
}
#else
/* ISO C wants a translation unit to declare something */
typedef int mutant_unused;
#endif
