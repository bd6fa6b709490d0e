/*
 * test_job_message.c - the broker message built from a claimed row, the one
 * mapping both pipelines use.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include "job_message.h"

static const struct store_identity IDENTITY = {.database_id = "db1", .epoch = 3, .history = "db1:3",
                                               .history_name = "db1:3.0f1e2d3c4b5a"};

/* Every field a broker reads comes from the row, the strings borrowed, not copied. */
static void
test_every_field_comes_from_the_row(void **state)
{
    static const char payload[] = "{\"n\":1}";
    const struct outbox_job job = {
        .job_id = 42,
        .generation = 3,
        .max_attempts = 5,
        .queue = "orders",
        .payload = payload,
        .payload_len = sizeof(payload) - 1,
        .headers = "{\"h\":\"v\"}",
        .ordering_key = "customer-7",
        .created_at = 1700000000.25,
        .replays = 2,
        .exchange = "events",
        .routing_key = "orders.created",
    };
    struct sink_message m = job_message_from_job(&job, &IDENTITY);

    (void)state;
    assert_int_equal(m.job_id, 42);
    assert_int_equal(m.attempt, 3); /* the generation: the attempt this claim is */
    assert_ptr_equal(m.queue, job.queue);
    assert_ptr_equal(m.payload, job.payload);
    assert_int_equal(m.payload_len, sizeof(payload) - 1);
    assert_ptr_equal(m.headers, job.headers);
    assert_true(m.created_at == job.created_at);
    assert_int_equal(m.replay, 2);
    assert_ptr_equal(m.exchange, job.exchange);
    assert_ptr_equal(m.routing_key, job.routing_key);
    assert_ptr_equal(m.ordering_key, job.ordering_key);
}

/* A row without routing or ordering fields leaves them to the broker's defaults. */
static void
test_absent_fields_stay_null(void **state)
{
    const struct outbox_job job = {.job_id = 1, .generation = 1, .queue = "q", .payload = "{}",
                                   .payload_len = 2, .headers = "{}"};
    struct sink_message m = job_message_from_job(&job, &IDENTITY);

    (void)state;
    assert_null(m.exchange);
    assert_null(m.routing_key);
    assert_null(m.ordering_key);
    assert_null(m.place.order);
}

/*
 * A row a disabled stream handed back keeps its place for the broker; once
 * replayed it has none, so it is published again.
 */
static void
test_place_only_before_a_replay(void **state)
{
    struct outbox_job job = {.job_id = 9, .generation = 1, .queue = "q", .payload = "{}",
                             .payload_len = 2, .headers = "{}", .stream_order = "1764000000:3",
                             .stream_place = "000000000000000007770000000000000000009"};
    struct sink_message m = job_message_from_job(&job, &IDENTITY);

    (void)state;
    assert_ptr_equal(m.place.order, job.stream_order);
    assert_ptr_equal(m.place.at, job.stream_place);
    assert_null(m.place.floor); /* the claims' rows are not the partition's next rows */
    job.replays = 1;
    m = job_message_from_job(&job, &IDENTITY);
    assert_null(m.place.order);
    assert_null(m.place.at);
}

#define UID "0b6f3c7e-2f1d-4a55-9b1e-6c0d2a8e4f10"

/*
 * The id consumers deduplicate on is the database and the row's own uuid,
 * with ".r<n>" for a replay; a database of an earlier form shows its form
 * (with the epoch, or the bare job id), while the broker's own dedup keys
 * always take the uuid form.
 */
static void
test_message_ids(void **state)
{
    struct store_identity old = IDENTITY;
    struct outbox_job job = {.job_id = 42, .generation = 1, .queue = "q", .payload = "{}",
                             .payload_len = 2, .headers = "{}", .message_uid = UID};
    struct sink_message m = job_message_from_job(&job, &IDENTITY);

    (void)state;
    assert_string_equal(m.message_id, "db1:" UID);
    assert_string_equal(m.dedup_id, "db1:" UID);
    assert_string_equal(m.history, "db1:3.0f1e2d3c4b5a"); /* order records: the history's name */
    job.replays = 2;
    m = job_message_from_job(&job, &IDENTITY);
    assert_string_equal(m.message_id, "db1:" UID ".r2");
    assert_string_equal(m.dedup_id, "db1:" UID ".r2");
    old.form = STORE_ID_FORM_DATABASE;
    m = job_message_from_job(&job, &old);
    assert_string_equal(m.message_id, "db1:3:42.r2");
    assert_string_equal(m.dedup_id, "db1:" UID ".r2");
    old.form = STORE_ID_FORM_JOB;
    m = job_message_from_job(&job, &old);
    assert_string_equal(m.message_id, "42.r2");
    assert_string_equal(m.dedup_id, "db1:" UID ".r2");
    job.replays = 0;
    m = job_message_from_job(&job, &old);
    assert_string_equal(m.message_id, "42");
    assert_string_equal(m.dedup_id, "db1:" UID);
    assert_int_equal(m.job_id, 42);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_message_ids),
        cmocka_unit_test(test_every_field_comes_from_the_row),
        cmocka_unit_test(test_absent_fields_stay_null),
        cmocka_unit_test(test_place_only_before_a_replay),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
