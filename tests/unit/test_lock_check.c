/*
 * test_lock_check.c - lock_held_by_caller() tells the holder of a mutex from
 * every other thread, also after a condition wait gave the mutex back.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <time.h>

#include "lock_check.h"

static pthread_mutex_t mutex = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;

static void *
ask_from_another_thread(void *arg)
{
    (void)arg;
    return lock_held_by_caller(&mutex) ? &mutex : NULL;
}

static void
test_holder_alone(void **state)
{
    pthread_t other;
    void *answer = &other;

    (void)state;
    assert_false(lock_held_by_caller(&mutex));
    pthread_mutex_lock(&mutex);
    assert_true(lock_held_by_caller(&mutex));
    /* another thread, while this one holds it */
    assert_int_equal(pthread_create(&other, NULL, ask_from_another_thread, NULL), 0);
    assert_int_equal(pthread_join(other, &answer), 0);
    assert_null(answer);
    pthread_mutex_unlock(&mutex);
    assert_false(lock_held_by_caller(&mutex));
}

static void
test_held_again_after_a_wait(void **state)
{
    struct timespec at;

    (void)state;
    pthread_mutex_lock(&mutex);
    clock_gettime(CLOCK_REALTIME, &at);
    at.tv_nsec += 1000000;
    if (at.tv_nsec >= 1000000000) {
        at.tv_sec++;
        at.tv_nsec -= 1000000000;
    }
    pthread_cond_timedwait(&cond, &mutex, &at);
    assert_true(lock_held_by_caller(&mutex));
    pthread_mutex_unlock(&mutex);
    assert_false(lock_held_by_caller(&mutex));
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_holder_alone),
        cmocka_unit_test(test_held_again_after_a_wait),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
