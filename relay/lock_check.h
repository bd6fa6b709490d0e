/*
 * lock_check.h - the debug build's check that a thread holds the lock a
 * shared field needs.
 *
 * Each field the relay's threads share says what guards it (a comment
 * "guard:" beside it; the table of threads and locks is in docs/design.md).
 * A function that touches fields under a lock its caller took ("Under the
 * lock.") opens with LOCK_ASSERT_HELD(&that_lock): without NDEBUG it aborts
 * when the calling thread does not hold the mutex; with NDEBUG it is
 * nothing. Plain pthread mutexes stay as they are: the owner is the one
 * glibc records in every mutex it locks (condition waits included), so no
 * lock or unlock changes to use it. Elsewhere than glibc the check passes.
 */
#ifndef OUTBOX_RELAY_LOCK_CHECK_H
#define OUTBOX_RELAY_LOCK_CHECK_H

#include <assert.h>
#include <pthread.h>
#include <stdbool.h>

/* True when the calling thread holds mutex (always true where it cannot be told). */
bool lock_held_by_caller(const pthread_mutex_t *mutex);

#ifdef NDEBUG
#define LOCK_ASSERT_HELD(mutex) ((void)0)
#else
#define LOCK_ASSERT_HELD(mutex) assert(lock_held_by_caller(mutex))
#endif

#endif
