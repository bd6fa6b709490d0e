/*
 * broker_matrix.c - suites run once per broker (see broker_matrix.h).
 */
#include "broker_matrix.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int
broker_matrix_run(const char *group, const void *brokers, size_t broker_count,
                  size_t broker_size, const struct broker_scenario *scenarios,
                  size_t scenario_count, CMFixtureFunction setup, CMFixtureFunction teardown)
{
    size_t total = broker_count * scenario_count, n = 0;
    struct CMUnitTest *tests = calloc(total, sizeof(*tests));
    char (*names)[96] = calloc(total, sizeof(*names));
    int failed;

    assert_true(tests != NULL && names != NULL);
    for (size_t b = 0; b < broker_count; b++) {
        const void *broker = (const char *)brokers + b * broker_size;
        const char *name = *(const char *const *)broker;

        for (size_t s = 0; s < scenario_count; s++, n++) {
            snprintf(names[n], sizeof(names[n]), "%s: %s", name, scenarios[s].name);
            tests[n] = (struct CMUnitTest){names[n], scenarios[s].run, setup, teardown,
                                           (void *)broker};
        }
    }
    if (getenv("OUTBOX_TEST_FILTER") != NULL)
        cmocka_set_test_filter(getenv("OUTBOX_TEST_FILTER"));
    failed = _cmocka_run_group_tests(group, tests, total, NULL, NULL);
    free(tests);
    free(names);
    return failed;
}

void
broker_nats_stream_name(const char *prefix, char *out, size_t size)
{
    snprintf(out, size, "%.*s", (int)strlen(prefix) - 1, prefix);
}

nats_consumer *
broker_nats_stream_open(const char *url, char *prefix)
{
    char name[96], subject[112];
    nats_consumer *nats;

    prefix[strlen(prefix) - 1] = '.';
    broker_nats_stream_name(prefix, name, sizeof(name));
    snprintf(subject, sizeof(subject), "%s>", prefix);
    nats = nats_consumer_connect(url);
    assert_non_null(nats);
    assert_int_equal(nats_consumer_create_stream(
                         nats, name, &(struct nats_consumer_stream_options){.subject = subject}),
                     0);
    return nats;
}

void
broker_nats_stream_close(nats_consumer *nats, const char *prefix)
{
    char name[96];

    broker_nats_stream_name(prefix, name, sizeof(name));
    nats_consumer_delete_stream(nats, name);
    nats_consumer_free(nats);
}
