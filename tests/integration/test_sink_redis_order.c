/*
 * test_sink_redis_order.c - the Redis sink's dedup by place (messages of a
 * stream partition, sink_message.place_*) against a real Redis 7.
 *
 * A message with a place is appended at most once per stream like any
 * other, but in turn (its previous row known to be there) it leaves no
 * dedup record of its own: the order's record says how far it was
 * appended. What must never happen is a message skipped because a later
 * one went out: a refused message stays out of the order's count until it
 * is appended. Needs OUTBOX_TEST_REDIS_URL; skipped without it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "redis_consumer.h"
#include "sink.h"
#include "sink_redis.h"

#define MESSAGES_MAX 400
#define SMALL_LIMIT 1000 /* max_message_bytes of the sinks here */

struct fixture {
    const char *url;
    redisContext *consumer;
    char prefix[96];
    char stream[160]; /* prefix + "orders" */
    struct sink_message messages[MESSAGES_MAX];
    struct sink_outcome outcomes[MESSAGES_MAX];
    char places[MESSAGES_MAX][40];
    char uids[MESSAGES_MAX][40];
    char verdicts[MESSAGES_MAX][SINK_CHECK_SIZE + 8];
    char big[2 * SMALL_LIMIT];
};

static int
setup(void **state)
{
    static unsigned sequence;
    const char *url = getenv("OUTBOX_TEST_REDIS_URL");
    struct fixture *f;

    if (url == NULL || url[0] == '\0') {
        *state = NULL;
        return 0;
    }
    f = calloc(1, sizeof(*f));
    assert_non_null(f);
    f->url = url;
    f->consumer = stream_consumer_connect(url);
    assert_non_null(f->consumer);
    snprintf(f->prefix, sizeof(f->prefix), "outbox-order-test:%ld:%u:", (long)getpid(), ++sequence);
    snprintf(f->stream, sizeof(f->stream), "%sorders", f->prefix);
    memset(f->big, 'x', sizeof(f->big) - 1);
    *state = f;
    return 0;
}

static int
teardown(void **state)
{
    struct fixture *f = *state;
    if (f == NULL)
        return 0;
    stream_consumer_delete_test_keys(f->consumer, f->prefix);
    redisFree(f->consumer);
    free(f);
    return 0;
}

#define NEED_REDIS(f)                                                                              \
    do {                                                                                           \
        if ((f) == NULL) {                                                                         \
            print_message("OUTBOX_TEST_REDIS_URL is not set: skipped\n");                          \
            skip();                                                                                \
        }                                                                                          \
    } while (0)

static sink *
open_sink(const struct fixture *f)
{
    struct sink_options options = {0};
    struct sink_redis_config redis = {.stream_prefix = f->prefix,
                                      .wait_replicas = SINK_REDIS_WAIT_BY_TOPOLOGY};
    struct outbox_error err;
    sink *s;

    options.url = f->url;
    *sink_options_broker(&options, "redis") = &redis;
    options.connect_timeout_ms = 2000;
    options.io_timeout_ms = 5000;
    options.max_message_bytes = SMALL_LIMIT;
    s = sink_new(&options, &err);
    if (s == NULL)
        fail_msg("sink_new: %s", err.message);
    if (sink_connect(s, &err) != 0)
        fail_msg("sink_connect: %s", err.message);
    return s;
}

/* The place of job id in order "7:0": xid 1000 + id, then the id. */
static const char *
place_of(struct fixture *f, int64_t id)
{
    snprintf(f->places[id], sizeof(f->places[id]), "%020lld%019lld", 1000LL + (long long)id,
             (long long)id);
    return f->places[id];
}

/*
 * Makes messages[0..] the rows first..last of order "7:<partition>" (job id
 * = place), floor the place before first (NULL: unknown, as for rows a
 * disabled stream handed back); returns their count.
 */
static size_t
rows(struct fixture *f, int64_t first, int64_t last, const char *order, int64_t floor_id)
{
    size_t n = 0;

    for (int64_t id = first; id <= last; id++, n++) {
        f->messages[n] = (struct sink_message){
            .job_id = id,
            .attempt = 1,
            .queue = "orders",
            .payload = "{\"n\":1}",
            .payload_len = 7,
            .headers = "{}",
            .place.order = order,
            .place.at = place_of(f, id),
            .place.floor = floor_id < 0 ? NULL : f->places[floor_id],
            .history = "test:1",
        };
        snprintf(f->messages[n].message_id, sizeof(f->messages[n].message_id), "%lld", (long long)id);
        snprintf(f->messages[n].dedup_id, sizeof(f->messages[n].dedup_id), "test:1:%lld",
                 (long long)id);
    }
    if (floor_id == 0)
        memset(f->places[0], '0', 39);
    return n;
}

/* Publishes messages[0..n-1]; the number accepted. */
static size_t
publish(struct fixture *f, sink *s, size_t n)
{
    struct outbox_error err;
    size_t accepted = 0;

    memset(f->outcomes, 0xff, sizeof(f->outcomes));
    assert_int_equal(sink_publish(s, f->messages, n, f->outcomes, &err), 0);
    for (size_t i = 0; i < n; i++)
        if (f->outcomes[i].status == SINK_ACCEPTED)
            accepted++;
    return accepted;
}

/* How many times each job id 1..last is in stream; fails on an id out of range. */
static void
assert_each_once(struct fixture *f, const char *stream, int64_t last)
{
    struct stream_consumer_stream entries;
    int seen[MESSAGES_MAX] = {0};

    assert_int_equal(stream_consumer_read_stream(f->consumer, stream, &entries), 0);
    for (size_t i = 0; i < entries.count; i++) {
        assert_in_range(entries.entries[i].job_id, 1, last);
        seen[entries.entries[i].job_id]++;
    }
    for (int64_t id = 1; id <= last; id++)
        if (seen[id] != 1)
            fail_msg("job %lld is in %s %d times", (long long)id, stream, seen[id]);
    stream_consumer_stream_clear(&entries);
}

/* Keys "{<stream>}<infix>*". */
static long long
records(struct fixture *f, const char *infix)
{
    char prefix[256];

    snprintf(prefix, sizeof(prefix), "{%s}%s", f->stream, infix);
    return stream_consumer_count_prefix(f->consumer, prefix);
}

/* The order record of order "7:<partition>" in the fixture's stream, or "" when none. */
static void
order_record(struct fixture *f, int partition, char *out, size_t size)
{
    char key[256];
    const char *argv[2] = {"GET", key};
    redisReply *reply;

    snprintf(key, sizeof(key), "{%s}:outbox-order:orders:test:1:7:%d", f->stream, partition);
    reply = stream_consumer_command(f->consumer, 2, argv);
    assert_non_null(reply);
    snprintf(out, size, "%s", reply->type == REDIS_REPLY_STRING ? reply->str : "");
    freeReplyObject(reply);
}

/*
 * 300 rows in turn (three script calls): appended once each, however often
 * and by whichever sink they are published again, with one record for the
 * order and none per message; the record says how far the order went.
 */
static void
test_in_turn_rows_leave_one_record(void **state)
{
    struct fixture *f = *state;
    char record[128], want[128];
    size_t n;
    sink *s;

    NEED_REDIS(f);
    s = open_sink(f);
    n = rows(f, 1, 300, "7:0", 0);
    assert_int_equal(publish(f, s, n), 300);
    assert_int_equal(publish(f, s, n), 300);
    sink_free(s);
    s = open_sink(f);
    assert_int_equal(publish(f, s, n), 300);
    assert_each_once(f, f->stream, 300);
    assert_int_equal(records(f, ":outbox-dedup:"), 0);
    assert_int_equal(records(f, ":outbox-order:"), 1);
    order_record(f, 0, record, sizeof(record));
    snprintf(want, sizeof(want), "%s%039d", f->places[300], 0);
    assert_string_equal(record, want);
    sink_free(s);
}

/*
 * Row 3 of 6 is refused (too large). Rows 4 to 6 go out of turn, each
 * under a record of its own, and the order stays at row 2. The owner after
 * (a takeover from the cursor at row 2) appends row 3 and only row 3.
 */
static void
test_a_refused_row_is_never_passed(void **state)
{
    struct fixture *f = *state;
    char record[128];
    size_t n;
    sink *s;

    NEED_REDIS(f);
    s = open_sink(f);
    n = rows(f, 1, 6, "7:0", 0);
    f->messages[2].payload = f->big;
    f->messages[2].payload_len = strlen(f->big);
    assert_int_equal(publish(f, s, n), 5);
    assert_int_equal(f->outcomes[2].status, SINK_REJECTED);
    assert_int_equal(records(f, ":outbox-dedup:"), 3);
    order_record(f, 0, record, sizeof(record));
    assert_int_equal(strncmp(record, f->places[2], 39), 0);
    assert_string_equal(record + 39, f->places[6]);

    n = rows(f, 3, 6, "7:0", 2);
    assert_int_equal(publish(f, s, n), 4);
    assert_each_once(f, f->stream, 6);
    order_record(f, 0, record, sizeof(record));
    assert_int_equal(strncmp(record, f->places[6], 39), 0);
    sink_free(s);
}

/*
 * Rows a disabled stream handed back (no floor, not in turn) against the
 * order: rows 4 and 5 were appended by the stream and are not again, 6 to
 * 8 are, under records; the stream's owner, still publishing 6 to 8 in
 * turn, finds those records; row 9 goes on in turn.
 */
static void
test_rows_handed_back_meet_the_order(void **state)
{
    struct fixture *f = *state;
    size_t n;
    sink *s;

    NEED_REDIS(f);
    s = open_sink(f);
    n = rows(f, 1, 5, "7:0", 0);
    assert_int_equal(publish(f, s, n), 5);
    n = rows(f, 4, 8, "7:0", -1);
    assert_int_equal(publish(f, s, n), 5);
    assert_int_equal(records(f, ":outbox-dedup:"), 3);
    n = rows(f, 6, 8, "7:0", 5);
    assert_int_equal(publish(f, s, n), 3);
    n = rows(f, 9, 9, "7:0", 8);
    assert_int_equal(publish(f, s, n), 1);
    assert_each_once(f, f->stream, 9);
    assert_int_equal(records(f, ":outbox-dedup:"), 3);
    sink_free(s);
}

/*
 * Two partitions interleaved in one batch, each row routed to one of two
 * streams: four orders, each counted on its own; published again, nothing
 * is appended.
 */
static void
test_orders_of_partitions_and_streams_are_apart(void **state)
{
    struct fixture *f = *state;
    char other[200];
    struct stream_consumer_stream entries;
    size_t n;
    sink *s;

    NEED_REDIS(f);
    s = open_sink(f);
    n = rows(f, 1, 200, NULL, 0);
    for (size_t i = 0; i < n; i++) {
        f->messages[i].place.order = i % 2 == 0 ? "7:0" : "7:1";
        f->messages[i].routing_key = i % 3 == 0 ? "returns" : NULL;
    }
    assert_int_equal(publish(f, s, n), 200);
    assert_int_equal(publish(f, s, n), 200);
    snprintf(other, sizeof(other), "%sreturns", f->prefix);
    assert_int_equal(stream_consumer_stream_length(f->consumer, f->stream), 133);
    assert_int_equal(stream_consumer_read_stream(f->consumer, other, &entries), 0);
    assert_int_equal(entries.count, 67);
    for (size_t i = 0; i < entries.count; i++)
        assert_int_equal((entries.entries[i].job_id - 1) % 3, 0);
    stream_consumer_stream_clear(&entries);
    assert_int_equal(records(f, ":outbox-dedup:"), 0);
    assert_int_equal(records(f, ":outbox-order:"), 2);
    sink_free(s);
}

/*
 * Rows first..last of history h (1 or 2) of order "7:0": each named by an
 * identity of its history and published under its message id, as a
 * database's rows are after a failover gave out their job ids and places
 * again; returns their count.
 */
static size_t
rows_of_history(struct fixture *f, int h, int64_t first, int64_t last, int64_t floor_id)
{
    size_t n = rows(f, first, last, "7:0", floor_id);

    for (size_t i = 0; i < n; i++) {
        int64_t id = first + (int64_t)i;

        snprintf(f->uids[id], sizeof(f->uids[id]), "0000000%d-0000-4000-8000-%012lld", h,
                 (long long)id);
        f->messages[i].place.uid = f->uids[id];
        snprintf(f->messages[i].dedup_id, sizeof(f->messages[i].dedup_id), "test:%s", f->uids[id]);
    }
    return n;
}

/*
 * A second history of the database (a second standby promoted: the same
 * epoch, its job ids and places given out again to other rows) meets the
 * order record the first one left at row done. The second's rows
 * from..done are at or before that place: the broker asks whether the
 * database holds the row the record names. Its rows after done must wait
 * for the answer too, in the script call that asked and in the later ones
 * of the batch (a call takes SCRIPT_CHUNK messages): appended in turn past
 * the asking rows, they would move the record onto a row this database
 * does hold, and the answer "ok" would then skip the asking rows; appended
 * out of turn, they would go out before them. Answered "gone", all of them
 * go out, each once.
 */
static void
assert_rows_after_a_check_wait(struct fixture *f, int64_t from, int64_t done, int64_t last)
{
    struct stream_consumer_stream entries;
    int seen[MESSAGES_MAX] = {0};
    size_t n;
    sink *s;

    s = open_sink(f);
    n = rows_of_history(f, 1, 1, done, 0);
    assert_int_equal(publish(f, s, n), done);
    n = rows_of_history(f, 2, from, last, from - 1);
    assert_int_equal(publish(f, s, n), 0);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(f->outcomes[i].status, SINK_DEFERRED);
        assert_string_equal(f->outcomes[0].check, f->outcomes[i].check);
        snprintf(f->verdicts[i], sizeof(f->verdicts[i]), "gone%s", f->outcomes[i].check);
        f->messages[i].place.verdict = f->verdicts[i];
    }
    assert_int_equal(publish(f, s, n), n);
    assert_int_equal(stream_consumer_read_stream(f->consumer, f->stream, &entries), 0);
    assert_int_equal(entries.count, done + n);
    for (size_t i = 0; i < entries.count; i++)
        seen[entries.entries[i].job_id]++;
    for (int64_t id = 1; id <= last; id++)
        assert_int_equal(seen[id], id >= from && id <= done ? 2 : 1);
    stream_consumer_stream_clear(&entries);
    sink_free(s);
}

/* Rows 6 to 10 ask, 11 and 12 come after them in the same script call. */
static void
test_rows_after_a_check_wait_for_its_answer(void **state)
{
    struct fixture *f = *state;

    NEED_REDIS(f);
    assert_rows_after_a_check_wait(f, 6, 10, 12);
}

/* Rows 101 to 150 ask; 151 to 250 come after them, the last 50 in the batch's second call. */
static void
test_rows_after_a_check_wait_in_the_calls_after(void **state)
{
    struct fixture *f = *state;

    NEED_REDIS(f);
    assert_rows_after_a_check_wait(f, 101, 150, 250);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_in_turn_rows_leave_one_record, setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_refused_row_is_never_passed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rows_handed_back_meet_the_order, setup, teardown),
        cmocka_unit_test_setup_teardown(test_orders_of_partitions_and_streams_are_apart, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_rows_after_a_check_wait_for_its_answer, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_rows_after_a_check_wait_in_the_calls_after, setup,
                                        teardown),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
