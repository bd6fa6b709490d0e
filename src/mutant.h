/*
 * mutant.h - defects planted on purpose, for the torture's mutation gate.
 *
 * A mutant is a small block under #ifdef OUTBOX_MUTANTS at the exact place a
 * real defect would be (a mark without a publish, a mark without its fence,
 * ...). Only the build of `make mutants` (build-mutants/, never bin/) defines
 * OUTBOX_MUTANTS; every other build compiles none of these blocks, so no
 * setting of a production binary can enable one. In the mutant build a block
 * acts only when the environment variable OUTBOX_MUTANT names it, and says so
 * on stderr ("outbox mutant <name> fired") the first time, so that the gate
 * (tests/torture/test_mutants.sh) knows that the defect it judged was live.
 */
#ifndef OUTBOX_MUTANT_H
#define OUTBOX_MUTANT_H

#ifdef OUTBOX_MUTANTS
#include <stdbool.h>

/* True when OUTBOX_MUTANT names name; the first true logs the firing. Thread-safe. */
bool mutant_fires(const char *name);

/* mutant_fires(name) on one call in every (a counter shared by all names). */
bool mutant_fires_every(const char *name, unsigned every);
#endif

#endif
