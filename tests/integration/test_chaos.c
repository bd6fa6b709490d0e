/*
 * test_chaos.c - the bounded fault-injection run of `make test`: the chaos
 * driver (tests/chaos/chaos.h) against RabbitMQ, then against Redis, each
 * with faults for OUTBOX_CHAOS_SECONDS (default 45) plus the drain.
 *
 * OUTBOX_CHAOS_SEED replays a schedule; OUTBOX_CHAOS_BROKERS (rabbitmq,
 * redis or both, the default) picks the runs; `make soak` runs this binary
 * longer with OUTBOX_CHAOS_SOAK=1.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "chaos.h"

#define DEFAULT_SECONDS 45

/* True when OUTBOX_CHAOS_BROKERS leaves this broker in (unset: both). */
static bool
broker_selected(const char *name)
{
    const char *brokers = getenv("OUTBOX_CHAOS_BROKERS");

    return brokers == NULL || *brokers == '\0' || strstr(brokers, name) != NULL;
}

static void
test_chaos_rabbitmq(void **state)
{
    struct chaos_options options;

    (void)state;
    if (!broker_selected("rabbitmq"))
        skip();
    chaos_options_from_env(&options, CHAOS_RABBITMQ, DEFAULT_SECONDS);
    assert_true(chaos_run(&options));
}

static void
test_chaos_redis(void **state)
{
    struct chaos_options options;

    (void)state;
    if (!broker_selected("redis"))
        skip();
    chaos_options_from_env(&options, CHAOS_REDIS, DEFAULT_SECONDS);
    assert_true(chaos_run(&options));
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chaos_rabbitmq),
        cmocka_unit_test(test_chaos_redis),
    };

    return cmocka_run_group_tests_name("chaos", tests, NULL, NULL);
}
