/*
 * broker_matrix.h - suites whose scenarios run once per broker, and the
 * destination they share on NATS: a JetStream stream over a test's prefix.
 */
#ifndef OUTBOX_TESTS_BROKER_MATRIX_H
#define OUTBOX_TESTS_BROKER_MATRIX_H

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "nats_consumer.h"

/* One scenario of a suite. */
struct broker_scenario {
    const char *name;
    void (*run)(void **state);
};

/*
 * Runs every scenario for every broker as a cmocka test named "broker:
 * scenario", with setup and teardown, its initial state the broker's row.
 * brokers is an array of broker_count rows of broker_size bytes, each
 * starting with its name (a const char *). OUTBOX_TEST_FILTER (a cmocka
 * pattern, e.g. "nats: *") runs only those that match. cmocka's result.
 */
int broker_matrix_run(const char *group, const void *brokers, size_t broker_count,
                      size_t broker_size, const struct broker_scenario *scenarios,
                      size_t scenario_count, CMFixtureFunction setup, CMFixtureFunction teardown);

/* The name of the NATS stream of prefix: the prefix without its last character. */
void broker_nats_stream_name(const char *prefix, char *out, size_t size);

/*
 * Connects to url and creates the stream of prefix over the subjects
 * "<prefix>>", once prefix's last character is made a '.' (the relay's
 * --subject-prefix). Fails the test when it cannot.
 */
nats_consumer *broker_nats_stream_open(const char *url, char *prefix);

/* Deletes the stream of prefix and disconnects. */
void broker_nats_stream_close(nats_consumer *nats, const char *prefix);

#endif
