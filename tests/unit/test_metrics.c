/*
 * test_metrics.c - what Prometheus scrapes: a strict line-by-line check of
 * the text format, counts that add up after known updates, label escaping,
 * and health as /healthz reports it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "metrics.h"

#define MAX_LABELS 4
#define MAX_SAMPLES 512
#define MAX_FAMILIES 64

struct label {
    char key[64];
    char value[256];
};

struct sample {
    char name[128];
    struct label labels[MAX_LABELS];
    int label_count;
    double value;
};

struct family {
    char name[128];
    char type[16];
    bool help;
};

struct exposition {
    struct sample samples[MAX_SAMPLES];
    int sample_count;
    struct family families[MAX_FAMILIES];
    int family_count;
};

static bool
valid_metric_name(const char *s)
{
    if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || *s == '_' || *s == ':'))
        return false;
    for (s++; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
              *s == '_' || *s == ':'))
            return false;
    return true;
}

static struct family *
find_family(struct exposition *e, const char *name)
{
    for (int i = 0; i < e->family_count; i++)
        if (strcmp(e->families[i].name, name) == 0)
            return &e->families[i];
    return NULL;
}

static bool
has_suffix(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);

    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* The family a sample belongs to: itself, or a histogram minus _bucket/_sum/_count. */
static struct family *
family_of_sample(struct exposition *e, const char *name)
{
    static const char *const suffixes[] = {"_bucket", "_sum", "_count"};
    struct family *f = find_family(e, name);
    char base[128];

    if (f != NULL && strcmp(f->type, "histogram") != 0)
        return f;
    for (size_t i = 0; i < 3; i++) {
        if (!has_suffix(name, suffixes[i]))
            continue;
        snprintf(base, sizeof(base), "%.*s", (int)(strlen(name) - strlen(suffixes[i])), name);
        f = find_family(e, base);
        if (f != NULL && strcmp(f->type, "histogram") == 0)
            return f;
    }
    return NULL;
}

/* Parses one sample line strictly; fails the test on any deviation. */
static void
parse_sample(struct exposition *e, const char *line)
{
    struct sample *s = &e->samples[e->sample_count++];
    const char *p = line;
    size_t n = strcspn(p, "{ ");
    char *end;

    assert_true(e->sample_count <= MAX_SAMPLES);
    memset(s, 0, sizeof(*s));
    assert_true(n > 0 && n < sizeof(s->name));
    memcpy(s->name, p, n);
    if (!valid_metric_name(s->name))
        fail_msg("bad metric name in: %s", line);
    p += n;
    if (*p == '{') {
        p++;
        while (*p != '}') {
            struct label *l = &s->labels[s->label_count++];
            size_t k = strcspn(p, "=");
            size_t v = 0;

            assert_true(s->label_count <= MAX_LABELS);
            assert_true(k > 0 && k < sizeof(l->key));
            memcpy(l->key, p, k);
            p += k + 1;
            if (*p++ != '"')
                fail_msg("label value not quoted: %s", line);
            while (*p != '"') {
                if (*p == '\0')
                    fail_msg("unterminated label value: %s", line);
                if (*p == '\\') {
                    p++;
                    if (*p == 'n')
                        l->value[v++] = '\n';
                    else if (*p == '\\' || *p == '"')
                        l->value[v++] = *p;
                    else
                        fail_msg("bad escape in: %s", line);
                } else {
                    l->value[v++] = *p;
                }
                p++;
                assert_true(v < sizeof(l->value));
            }
            p++;
            if (*p == ',')
                p++;
            else if (*p != '}')
                fail_msg("bad label list: %s", line);
        }
        p++;
    }
    if (*p++ != ' ')
        fail_msg("no space before value: %s", line);
    if (strcmp(p, "+Inf") == 0)
        s->value = INFINITY;
    else {
        s->value = strtod(p, &end);
        if (end == p || *end != '\0')
            fail_msg("bad value: %s", line);
    }
}

/* Parses a whole exposition and checks every rule of the text format we rely on. */
static void
parse_exposition(const char *text, struct exposition *e)
{
    char *copy = strdup(text), *line, *save = NULL;

    memset(e, 0, sizeof(*e));
    assert_non_null(copy);
    assert_true(strlen(text) > 0 && text[strlen(text) - 1] == '\n');
    for (line = strtok_r(copy, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (strncmp(line, "# HELP ", 7) == 0) {
            char name[128];
            struct family *f;

            assert_int_equal(sscanf(line + 7, "%127s", name), 1);
            f = find_family(e, name);
            if (f == NULL) {
                f = &e->families[e->family_count++];
                snprintf(f->name, sizeof(f->name), "%s", name);
            }
            assert_false(f->help);
            f->help = true;
        } else if (strncmp(line, "# TYPE ", 7) == 0) {
            char name[128], type[16];
            struct family *f;

            assert_int_equal(sscanf(line + 7, "%127s %15s", name, type), 2);
            if (!valid_metric_name(name))
                fail_msg("bad family name: %s", name);
            assert_true(strcmp(type, "counter") == 0 || strcmp(type, "gauge") == 0 ||
                        strcmp(type, "histogram") == 0);
            f = find_family(e, name);
            assert_non_null(f); /* HELP first */
            assert_string_equal(f->type, "");
            snprintf(f->type, sizeof(f->type), "%s", type);
            if (strcmp(type, "counter") == 0 && !has_suffix(name, "_total"))
                fail_msg("counter without _total: %s", name);
        } else {
            struct family *f;

            assert_true(line[0] != '#');
            parse_sample(e, line);
            f = family_of_sample(e, e->samples[e->sample_count - 1].name);
            if (f == NULL)
                fail_msg("sample of an undeclared family: %s", line);
            /* A sample belongs to the family declared just before it. */
            assert_ptr_equal(f, &e->families[e->family_count - 1]);
        }
    }
    free(copy);
}

static const char *
label_of(const struct sample *s, const char *key)
{
    for (int i = 0; i < s->label_count; i++)
        if (strcmp(s->labels[i].key, key) == 0)
            return s->labels[i].value;
    return NULL;
}

/* Value of the sample name{key="value"} (key NULL: the only sample), or NAN when absent. */
static double
value_of(const struct exposition *e, const char *name, const char *key, const char *value)
{
    for (int i = 0; i < e->sample_count; i++) {
        const struct sample *s = &e->samples[i];
        const char *v;

        if (strcmp(s->name, name) != 0)
            continue;
        if (key == NULL)
            return s->value;
        v = label_of(s, key);
        if (v != NULL && strcmp(v, value) == 0)
            return s->value;
    }
    return NAN;
}

/* Checks that buckets rise and that +Inf equals _count, for every histogram. */
static void
check_histograms(const struct exposition *e)
{
    for (int f = 0; f < e->family_count; f++) {
        char bucket[160], count[160];
        double previous = 0, inf = NAN;
        int buckets = 0;

        if (strcmp(e->families[f].type, "histogram") != 0)
            continue;
        snprintf(bucket, sizeof(bucket), "%s_bucket", e->families[f].name);
        snprintf(count, sizeof(count), "%s_count", e->families[f].name);
        for (int i = 0; i < e->sample_count; i++) {
            const struct sample *s = &e->samples[i];

            if (strcmp(s->name, bucket) != 0)
                continue;
            assert_non_null(label_of(s, "le"));
            assert_true(s->value >= previous);
            previous = s->value;
            buckets++;
            if (strcmp(label_of(s, "le"), "+Inf") == 0)
                inf = s->value;
        }
        assert_true(buckets > 1);
        assert_false(isnan(inf));
        assert_true(inf == value_of(e, count, NULL, NULL));
        /* No bare sample under the histogram's own name. */
        assert_true(isnan(value_of(e, e->families[f].name, NULL, NULL)));
    }
}

static struct exposition exposition;

static void
render_and_parse(struct metrics *m)
{
    size_t length = 0;
    char *text = metrics_render(m, &length);

    assert_non_null(text);
    assert_int_equal(length, strlen(text));
    parse_exposition(text, &exposition);
    check_histograms(&exposition);
    free(text);
}

static const char *const expected_families[] = {
    "outbox_rows_claimed_total",
    "outbox_rows_published_total",
    "outbox_rows_completed_total",
    "outbox_rows_failed_total",
    "outbox_rows_dead_total",
    "outbox_rows_reaped_total",
    "outbox_rows_released_total",
    "outbox_lease_lost_total",
    "outbox_claims_total",
    "outbox_rows_deleted_total",
    "outbox_reconnects_total",
    "outbox_rows_in_flight",
    "outbox_ready_rows",
    "outbox_oldest_ready_age_seconds",
    "outbox_queue_paused",
    "outbox_queue_paused_keys",
    "outbox_table_bytes",
    "outbox_index_bytes",
    "outbox_dead_tuples",
    "outbox_succeeded_rows",
    "outbox_succeeded_past_retention_rows",
    "outbox_oldest_succeeded_past_retention_seconds",
    "outbox_up",
    "outbox_publish_duration_seconds",
    "outbox_commit_to_publish_seconds",
};

static void
test_empty_registry_is_valid(void **state)
{
    struct metrics *m = metrics_new(NULL);

    (void)state;
    assert_non_null(m);
    render_and_parse(m);
    for (size_t i = 0; i < sizeof(expected_families) / sizeof(expected_families[0]); i++) {
        struct family *f = find_family(&exposition, expected_families[i]);

        if (f == NULL || !f->help || f->type[0] == '\0')
            fail_msg("family missing or without HELP/TYPE: %s", expected_families[i]);
    }
    assert_true(value_of(&exposition, "outbox_up", "target", "database") == 0);
    assert_true(value_of(&exposition, "outbox_rows_in_flight", NULL, NULL) == 0);
    metrics_free(m);
}

static void
test_counts_add_up(void **state)
{
    struct metrics *m = metrics_new("amqp");
    const struct metrics_queue_sample both[] = {{"orders", 120, 4.5, true, 0},
                                                {"billing", 3, 0.25, false, 2}};
    const struct metrics_queue_sample one[] = {{"billing", 7, 1.5, false, 0}};
    const double latencies[] = {0.0005, 0.003, 0.2, 20, -1};

    (void)state;
    metrics_add_queue(m, METRICS_ROWS_CLAIMED, "orders", 5);
    metrics_add_queue(m, METRICS_ROWS_CLAIMED, "orders", 3);
    metrics_add_queue(m, METRICS_ROWS_CLAIMED, "billing", 2);
    metrics_add_queue(m, METRICS_ROWS_PUBLISHED, "orders", 7);
    metrics_add_queue(m, METRICS_ROWS_COMPLETED, "orders", 6);
    metrics_add_queue(m, METRICS_ROWS_FAILED, "orders", 1);
    metrics_add_queue(m, METRICS_ROWS_DEAD, "billing", 1);
    metrics_add(m, METRICS_ROWS_REAPED, 4);
    metrics_add(m, METRICS_ROWS_RELEASED, 2);
    metrics_add(m, METRICS_LEASE_LOST, 1);
    metrics_add(m, METRICS_CLAIMS, 9);
    metrics_reconnected(m, METRICS_BROKER);
    metrics_reconnected(m, METRICS_BROKER);
    metrics_reconnected(m, METRICS_DATABASE);
    metrics_add_in_flight(m, 10);
    metrics_add_in_flight(m, -4);
    metrics_set_up(m, METRICS_DATABASE, true);
    metrics_set_queue_samples(m, both, 2);
    metrics_observe(m, METRICS_PUBLISH_DURATION, 0.02);
    metrics_observe_many(m, METRICS_COMMIT_TO_PUBLISH, latencies, 5);
    render_and_parse(m);

    assert_true(value_of(&exposition, "outbox_rows_claimed_total", "queue", "orders") == 8);
    assert_true(value_of(&exposition, "outbox_rows_claimed_total", "queue", "billing") == 2);
    assert_true(value_of(&exposition, "outbox_rows_published_total", "queue", "orders") == 7);
    assert_true(value_of(&exposition, "outbox_rows_published_total", "queue", "billing") == 0);
    assert_true(value_of(&exposition, "outbox_rows_completed_total", "queue", "orders") == 6);
    assert_true(value_of(&exposition, "outbox_rows_failed_total", "queue", "orders") == 1);
    assert_true(value_of(&exposition, "outbox_rows_dead_total", "queue", "billing") == 1);
    assert_true(value_of(&exposition, "outbox_rows_reaped_total", NULL, NULL) == 4);
    assert_true(value_of(&exposition, "outbox_rows_released_total", NULL, NULL) == 2);
    assert_true(value_of(&exposition, "outbox_lease_lost_total", NULL, NULL) == 1);
    assert_true(value_of(&exposition, "outbox_claims_total", NULL, NULL) == 9);
    assert_true(value_of(&exposition, "outbox_reconnects_total", "target", "broker") == 2);
    assert_true(value_of(&exposition, "outbox_reconnects_total", "target", "database") == 1);
    assert_true(value_of(&exposition, "outbox_rows_in_flight", NULL, NULL) == 6);
    assert_true(value_of(&exposition, "outbox_up", "target", "database") == 1);
    assert_true(value_of(&exposition, "outbox_up", "target", "broker") == 0);
    assert_true(value_of(&exposition, "outbox_ready_rows", "queue", "orders") == 120);
    assert_true(value_of(&exposition, "outbox_oldest_ready_age_seconds", "queue", "billing") ==
                0.25);
    assert_true(value_of(&exposition, "outbox_queue_paused", "queue", "orders") == 1);
    assert_true(value_of(&exposition, "outbox_queue_paused", "queue", "billing") == 0);
    assert_true(value_of(&exposition, "outbox_queue_paused_keys", "queue", "billing") == 2);

    /* Histogram: -1 counts as 0; 20 lands only in +Inf. */
    assert_true(value_of(&exposition, "outbox_commit_to_publish_seconds_bucket", "le", "0.001") ==
                2);
    assert_true(value_of(&exposition, "outbox_commit_to_publish_seconds_bucket", "le", "0.005") ==
                3);
    assert_true(value_of(&exposition, "outbox_commit_to_publish_seconds_bucket", "le", "0.25") ==
                4);
    assert_true(value_of(&exposition, "outbox_commit_to_publish_seconds_bucket", "le", "10") == 4);
    assert_true(value_of(&exposition, "outbox_commit_to_publish_seconds_bucket", "le", "+Inf") ==
                5);
    assert_true(fabs(value_of(&exposition, "outbox_commit_to_publish_seconds_sum", NULL, NULL) -
                     20.2035) < 1e-9);
    assert_true(value_of(&exposition, "outbox_publish_duration_seconds_count", NULL, NULL) == 1);

    /* The constant broker label is on every series. */
    for (int i = 0; i < exposition.sample_count; i++) {
        const char *broker = label_of(&exposition.samples[i], "broker");

        if (broker == NULL || strcmp(broker, "amqp") != 0)
            fail_msg("series without broker label: %s", exposition.samples[i].name);
    }

    /* A later sample replaces the backlog: a queue absent from it drops to 0. */
    metrics_set_queue_samples(m, one, 1);
    render_and_parse(m);
    assert_true(value_of(&exposition, "outbox_ready_rows", "queue", "orders") == 0);
    assert_true(value_of(&exposition, "outbox_oldest_ready_age_seconds", "queue", "orders") == 0);
    assert_true(value_of(&exposition, "outbox_ready_rows", "queue", "billing") == 7);
    /* a resumed queue drops back to 0 at the next sample */
    assert_true(value_of(&exposition, "outbox_queue_paused", "queue", "orders") == 0);
    assert_true(value_of(&exposition, "outbox_queue_paused_keys", "queue", "billing") == 0);

    /* The table sample replaces the table gauges as a whole. */
    metrics_set_table_sample(m, &(struct metrics_table_sample){
                                    .table_bytes = 8192000,
                                    .index_bytes = 4096000,
                                    .dead_tuples = 1234,
                                    .succeeded_rows = 300000,
                                    .succeeded_past_retention_rows = 25,
                                    .oldest_succeeded_past_retention_seconds = 7.5,
                                });
    metrics_add(m, METRICS_ROWS_DELETED, 5000);
    render_and_parse(m);
    assert_true(value_of(&exposition, "outbox_table_bytes", NULL, NULL) == 8192000);
    assert_true(value_of(&exposition, "outbox_index_bytes", NULL, NULL) == 4096000);
    assert_true(value_of(&exposition, "outbox_dead_tuples", NULL, NULL) == 1234);
    assert_true(value_of(&exposition, "outbox_succeeded_rows", NULL, NULL) == 300000);
    assert_true(value_of(&exposition, "outbox_succeeded_past_retention_rows", NULL, NULL) == 25);
    assert_true(value_of(&exposition, "outbox_oldest_succeeded_past_retention_seconds", NULL,
                         NULL) == 7.5);
    assert_true(value_of(&exposition, "outbox_rows_deleted_total", NULL, NULL) == 5000);
    metrics_free(m);
}

static void
test_label_escaping(void **state)
{
    struct metrics *m = metrics_new("we\"ird\\");
    const char *queue = "a\"b\\c\nd";
    size_t length;
    char *text;

    (void)state;
    metrics_add_queue(m, METRICS_ROWS_CLAIMED, queue, 3);
    text = metrics_render(m, &length);
    assert_non_null(text);
    assert_non_null(strstr(text, "outbox_rows_claimed_total{broker=\"we\\\"ird\\\\\","
                                 "queue=\"a\\\"b\\\\c\\nd\"} 3\n"));
    free(text);
    render_and_parse(m);
    assert_true(value_of(&exposition, "outbox_rows_claimed_total", "queue", queue) == 3);
    metrics_free(m);
}

static double fake_seconds;

static double
fake_clock(void *context)
{
    (void)context;
    return fake_seconds;
}

static void
test_health(void **state)
{
    struct metrics *m = metrics_new(NULL);
    char reason[128];
    bool ready = true;

    (void)state;
    fake_seconds = 1000;
    metrics_set_clock(m, fake_clock, NULL);

    /* an end not tried yet is not called down */
    assert_false(metrics_health(m, reason, sizeof(reason), &ready));
    assert_string_equal(reason, "database not connected yet; broker not connected yet");
    assert_false(ready);
    metrics_set_up(m, METRICS_DATABASE, false);
    assert_false(metrics_health(m, reason, sizeof(reason), &ready));
    assert_string_equal(reason, "database down; broker not connected yet");
    metrics_set_up(m, METRICS_BROKER, true);
    assert_false(metrics_health(m, reason, sizeof(reason), &ready));
    assert_string_equal(reason, "database down");
    /* one thread's loss: the broker answered the connect within the window */
    metrics_set_up(m, METRICS_BROKER, false);
    assert_false(metrics_health(m, reason, sizeof(reason), &ready));
    assert_string_equal(reason, "database down");
    fake_seconds += METRICS_ROUND_TRIP_MIN_WINDOW_SECONDS + 1;
    assert_false(metrics_health(m, reason, sizeof(reason), &ready));
    assert_string_equal(reason, "database and broker down");
    assert_false(ready);

    metrics_set_up(m, METRICS_DATABASE, true);
    metrics_set_up(m, METRICS_BROKER, true);
    assert_false(metrics_health(m, reason, sizeof(reason), &ready));
    assert_string_equal(reason, "relay loop not started");
    assert_true(ready);

    metrics_set_health(m, true, true);
    assert_true(metrics_health(m, reason, sizeof(reason), NULL));
    assert_string_equal(reason, "ok");

    fake_seconds += METRICS_HEALTH_STALE_SECONDS - 1;
    metrics_round_trip(m, METRICS_DATABASE);
    metrics_round_trip(m, METRICS_BROKER);
    assert_true(metrics_health(m, NULL, 0, NULL));
    fake_seconds += 13;
    metrics_round_trip(m, METRICS_DATABASE);
    metrics_round_trip(m, METRICS_BROKER);
    assert_false(metrics_health(m, reason, sizeof(reason), &ready));
    assert_string_equal(reason, "relay loop stalled for 42 s");
    assert_true(ready);

    metrics_set_health(m, true, false);
    assert_false(metrics_health(m, reason, sizeof(reason), &ready));
    assert_string_equal(reason, "broker down");
    assert_false(ready);
    metrics_free(m);
}

/*
 * The verdict follows the age of each end's last round trip: a thread that
 * cannot reconnect does not make an end down while another's round trips
 * go on, and connections that look open do not keep an end up once no
 * round trip succeeded within the window (max(3 x the longest idle wait,
 * 15 s)). /metrics shows the ages, /healthz's lines name them.
 */
static void
test_health_follows_round_trip_ages(void **state)
{
    struct metrics *m = metrics_new(NULL);
    char reason[128], ends[128], *text;
    bool ready = false;

    (void)state;
    fake_seconds = 1000;
    metrics_set_clock(m, fake_clock, NULL);
    metrics_describe_ends(m, ends, sizeof(ends));
    assert_string_equal(ends, "database: no round trip yet\nbroker: no round trip yet\n");
    render_and_parse(m);
    assert_true(isinf(value_of(&exposition, "outbox_last_round_trip_age_seconds", "target",
                               "database")));

    /* two pipelines connect; the second loses its database and cannot reconnect */
    metrics_set_health(m, true, true);
    metrics_set_up(m, METRICS_DATABASE, false);
    for (int i = 0; i < 60; i++) {
        fake_seconds += 1;
        metrics_round_trip(m, METRICS_DATABASE); /* the first pipeline goes on */
        metrics_round_trip(m, METRICS_BROKER);
        metrics_loop_turned(m);
        metrics_set_up(m, METRICS_DATABASE, false); /* the second one's failed attempt */
        assert_true(metrics_health(m, reason, sizeof(reason), &ready));
    }
    assert_string_equal(reason, "ok");
    assert_true(ready);

    /* every backend stops answering: connections look open, no round trip succeeds */
    metrics_set_up(m, METRICS_DATABASE, true);
    fake_seconds += 0.4;
    metrics_round_trip(m, METRICS_BROKER);
    metrics_describe_ends(m, ends, sizeof(ends));
    assert_string_equal(ends, "database: last round trip 0.4 s ago\n"
                              "broker: last round trip 0.0 s ago\n");
    for (int i = 0; i < (int)METRICS_ROUND_TRIP_MIN_WINDOW_SECONDS - 1; i++) {
        fake_seconds += 1;
        metrics_round_trip(m, METRICS_BROKER);
        metrics_loop_turned(m);
    }
    assert_true(metrics_health(m, NULL, 0, NULL)); /* within the window */
    fake_seconds += 1;
    metrics_round_trip(m, METRICS_BROKER);
    metrics_loop_turned(m);
    assert_false(metrics_health(m, reason, sizeof(reason), &ready));
    assert_string_equal(reason, "database down");
    assert_false(ready);
    render_and_parse(m);
    assert_true(value_of(&exposition, "outbox_last_round_trip_age_seconds", "target",
                         "database") > METRICS_ROUND_TRIP_MIN_WINDOW_SECONDS);
    assert_true(value_of(&exposition, "outbox_last_round_trip_age_seconds", "target", "broker") ==
                0);
    assert_true(value_of(&exposition, "outbox_up", "target", "database") == 1);

    /* they answer again */
    metrics_round_trip(m, METRICS_DATABASE);
    assert_true(metrics_health(m, reason, sizeof(reason), NULL));

    /* a long --poll-interval widens the window: 3 x 20 s */
    metrics_set_idle_wait(m, 20);
    fake_seconds += 59;
    metrics_loop_turned(m);
    assert_true(metrics_health(m, NULL, 0, NULL));
    fake_seconds += 2;
    metrics_loop_turned(m);
    assert_false(metrics_health(m, reason, sizeof(reason), NULL));
    assert_string_equal(reason, "database and broker down");
    /* a short one keeps the floor */
    metrics_set_idle_wait(m, 0.1);
    metrics_round_trip(m, METRICS_DATABASE);
    metrics_round_trip(m, METRICS_BROKER);
    fake_seconds += METRICS_ROUND_TRIP_MIN_WINDOW_SECONDS - 1;
    metrics_loop_turned(m);
    assert_true(metrics_health(m, NULL, 0, NULL));

    text = metrics_render(m, NULL);
    assert_non_null(strstr(text, "# TYPE outbox_last_round_trip_age_seconds gauge\n"));
    free(text);
    metrics_round_trip(NULL, METRICS_DATABASE);
    metrics_set_idle_wait(NULL, 1);
    metrics_describe_ends(NULL, ends, sizeof(ends));
    assert_string_equal(ends, "");
    metrics_free(m);
}

/*
 * Per-queue series stop at the cap: later queues add up under
 * queue="(other)", each counted once in outbox_metrics_queues_folded, so
 * /metrics stays the same size however many queue names appear.
 */
static void
test_queue_series_are_capped(void **state)
{
    struct metrics *m = metrics_new("redis");
    struct metrics_queue_sample samples[10];
    char names[10][16], *text;
    size_t lines = 0;

    (void)state;
    metrics_set_max_queues(m, 3);
    for (int i = 0; i < 10; i++) {
        snprintf(names[i], sizeof(names[i]), "q%d", i);
        metrics_add_queue(m, METRICS_ROWS_PUBLISHED, names[i], 1);
        samples[i] = (struct metrics_queue_sample){.queue = names[i], .ready_rows = 5,
                                                   .oldest_ready_age_seconds = i,
                                                   .paused = i == 7, .paused_keys = 1};
    }
    metrics_add_queue(m, METRICS_ROWS_PUBLISHED, "q0", 1); /* an own series keeps counting */
    metrics_add_queue(m, METRICS_ROWS_PUBLISHED, "q9", 1); /* a folded one is counted once */
    metrics_set_queue_samples(m, samples, 10);
    render_and_parse(m);
    assert_true(value_of(&exposition, "outbox_rows_published_total", "queue", "q0") == 2);
    assert_true(value_of(&exposition, "outbox_rows_published_total", "queue", "q2") == 1);
    assert_true(isnan(value_of(&exposition, "outbox_rows_published_total", "queue", "q3")));
    assert_true(value_of(&exposition, "outbox_rows_published_total", "queue", "(other)") == 8);
    assert_true(value_of(&exposition, "outbox_ready_rows", "queue", "(other)") == 35);
    assert_true(value_of(&exposition, "outbox_ready_rows", "queue", "q1") == 5);
    assert_true(value_of(&exposition, "outbox_oldest_ready_age_seconds", "queue", "(other)") == 9);
    assert_true(value_of(&exposition, "outbox_queue_paused", "queue", "(other)") == 1);
    assert_true(value_of(&exposition, "outbox_queue_paused_keys", "queue", "(other)") == 7);
    assert_true(value_of(&exposition, "outbox_metrics_queues_folded", NULL, NULL) == 7);

    /* 5 000 more queue names: the same number of series */
    for (int i = 0; i < 5000; i++) {
        char name[24];

        snprintf(name, sizeof(name), "tenant-%d", i);
        metrics_add_queue(m, METRICS_ROWS_CLAIMED, name, 1);
    }
    text = metrics_render(m, NULL);
    assert_non_null(text);
    for (const char *at = text; (at = strstr(at, "\noutbox_rows_claimed_total{")) != NULL; at++)
        lines++;
    free(text);
    assert_int_equal(lines, 4);
    render_and_parse(m);
    assert_true(value_of(&exposition, "outbox_metrics_queues_folded", NULL, NULL) == 5007);
    assert_true(value_of(&exposition, "outbox_rows_claimed_total", "queue", "(other)") == 5000);
    metrics_free(m);
}

/* A broker that takes none of a batch makes the relay unhealthy, saying why, until it does. */
static void
test_health_says_when_the_broker_holds_rows(void **state)
{
    struct metrics *m = metrics_new(NULL);
    char reason[128];
    bool ready = false;

    (void)state;
    fake_seconds = 1000;
    metrics_set_clock(m, fake_clock, NULL);
    metrics_set_health(m, true, true);
    metrics_set_broker_held(m, "redis primary 10.0.0.5:6379 has 0 replicas, fewer than"
                               " --redis-wait 1: rows wait for one");
    assert_false(metrics_health(m, reason, sizeof(reason), &ready));
    assert_string_equal(reason, "broker holds rows back: redis primary 10.0.0.5:6379 has 0"
                                " replicas, fewer than --redis-wait 1: rows wait for one");
    assert_true(ready);
    metrics_set_broker_held(m, NULL);
    assert_true(metrics_health(m, reason, sizeof(reason), NULL));
    assert_string_equal(reason, "ok");
    metrics_free(m);
}

/* The watchdog follows the loop alone: a database outage does not restart the relay. */
static void
test_loop_alive_ignores_the_ends(void **state)
{
    struct metrics *m = metrics_new(NULL);

    (void)state;
    fake_seconds = 1000;
    metrics_set_clock(m, fake_clock, NULL);
    assert_false(metrics_loop_alive(m)); /* not started */
    metrics_set_health(m, false, false);
    assert_true(metrics_loop_alive(m));
    assert_false(metrics_health(m, NULL, 0, NULL));
    fake_seconds += METRICS_HEALTH_STALE_SECONDS + 1;
    assert_false(metrics_loop_alive(m));
    metrics_loop_turned(m);
    assert_true(metrics_loop_alive(m));
    assert_false(metrics_loop_alive(NULL));
    metrics_free(m);
}

static void
test_horizon_age_gauge(void **state)
{
    struct metrics *m = metrics_new("redis");

    (void)state;
    render_and_parse(m);
    assert_true(value_of(&exposition, "outbox_xmin_horizon_age_seconds", NULL, NULL) == 0);
    metrics_set_horizon_age(m, 321.5);
    render_and_parse(m);
    assert_true(value_of(&exposition, "outbox_xmin_horizon_age_seconds", NULL, NULL) == 321.5);
    metrics_free(m);
}

/*
 * The stream gauges: absent until the first sample; then per partition lag
 * and owner, the horizon holder, and the queue cap folding later queues.
 */
static void
test_stream_gauges(void **state)
{
    struct metrics *m = metrics_new("redis");
    const struct metrics_stream_partition partitions[] = {
        {.queue = "a", .partition = 0, .owner = "r1/stream", .lag_rows = 7, .lag_seconds = 1.5},
        {.queue = "a", .partition = 1, .owner = "", .lag_rows = 0, .lag_seconds = 0},
        {.queue = "b", .partition = 0, .owner = "r2/stream", .lag_rows = 3, .lag_seconds = 9},
        {.queue = "c", .partition = 0, .owner = "r2/stream", .lag_rows = 1, .lag_seconds = 2},
    };
    const struct metrics_stream_horizon horizon = {.found = true, .pid = 4242, .age_seconds = 12.5};

    (void)state;
    metrics_set_max_queues(m, 2);
    render_and_parse(m);
    assert_true(isnan(value_of(&exposition, "outbox_stream_horizon_pid", NULL, NULL)));
    metrics_set_stream_sample(m, partitions, 4, &horizon);
    render_and_parse(m);
    assert_true(value_of(&exposition, "outbox_stream_lag_rows", "queue", "b") == 3);
    assert_true(value_of(&exposition, "outbox_stream_lag_seconds", "queue", "b") == 9);
    assert_true(value_of(&exposition, "outbox_stream_lag_rows", "partition", "1") == 0);
    assert_true(value_of(&exposition, "outbox_stream_partition_owned", "owner", "r1/stream") == 1);
    assert_true(value_of(&exposition, "outbox_stream_partition_owned", "owner", "") == 0);
    assert_true(isnan(value_of(&exposition, "outbox_stream_lag_rows", "queue", "c")));
    assert_true(value_of(&exposition, "outbox_stream_partitions_folded", NULL, NULL) == 1);
    assert_true(value_of(&exposition, "outbox_stream_horizon_pid", NULL, NULL) == 4242);
    assert_true(value_of(&exposition, "outbox_stream_horizon_age_seconds", NULL, NULL) == 12.5);
    /* a new sample replaces the old one whole */
    metrics_set_stream_sample(m, partitions + 2, 1, NULL);
    render_and_parse(m);
    assert_true(isnan(value_of(&exposition, "outbox_stream_lag_rows", "queue", "a")));
    assert_true(value_of(&exposition, "outbox_stream_horizon_pid", NULL, NULL) == 0);
    metrics_free(m);
}

/* outbox_broker_endpoint names each endpoint and counts the connections on it. */
static void
test_broker_endpoints(void **state)
{
    struct metrics *m = metrics_new("amqp");
    const char *const names[] = {"mq1:5672", "[::1]:5673", "mq3:5672"};

    (void)state;
    render_and_parse(m);
    assert_null(find_family(&exposition, "outbox_broker_endpoint"));

    assert_int_equal(metrics_set_endpoints(m, names, 3), 0);
    metrics_add_endpoint_connections(m, 1, 1);
    metrics_add_endpoint_connections(m, 1, 1);
    metrics_add_endpoint_connections(m, 0, 1);
    metrics_add_endpoint_connections(m, 0, -1); /* that pipeline lost mq1 ... */
    metrics_add_endpoint_connections(m, 2, 1);  /* ... and moved on to mq3 */
    metrics_add_endpoint_connections(m, 7, 1);  /* no such endpoint: ignored */
    render_and_parse(m);
    assert_non_null(find_family(&exposition, "outbox_broker_endpoint"));
    assert_true(value_of(&exposition, "outbox_broker_endpoint", "endpoint", "mq1:5672") == 0);
    assert_true(value_of(&exposition, "outbox_broker_endpoint", "endpoint", "[::1]:5673") == 2);
    assert_true(value_of(&exposition, "outbox_broker_endpoint", "endpoint", "mq3:5672") == 1);
    metrics_add_endpoint_connections(NULL, 0, 1);
    assert_int_equal(metrics_set_endpoints(NULL, names, 3), 0);
    metrics_free(m);
}

static void
test_null_is_ignored(void **state)
{
    (void)state;
    metrics_add(NULL, METRICS_CLAIMS, 1);
    metrics_add_queue(NULL, METRICS_ROWS_CLAIMED, "q", 1);
    metrics_observe(NULL, METRICS_PUBLISH_DURATION, 1);
    metrics_set_health(NULL, true, true);
    metrics_set_table_sample(NULL, &(struct metrics_table_sample){0});
    metrics_free(NULL);
    assert_null(metrics_render(NULL, NULL));
}

static void *
updater(void *arg)
{
    struct metrics *m = arg;

    for (int i = 0; i < 1000; i++) {
        metrics_add_queue(m, METRICS_ROWS_PUBLISHED, i % 2 ? "odd" : "even", 1);
        metrics_observe(m, METRICS_PUBLISH_DURATION, 0.01);
        metrics_add_in_flight(m, 1);
    }
    return NULL;
}

static void
test_concurrent_updates(void **state)
{
    struct metrics *m = metrics_new(NULL);
    pthread_t threads[4];

    (void)state;
    for (int i = 0; i < 4; i++)
        assert_int_equal(pthread_create(&threads[i], NULL, updater, m), 0);
    for (int i = 0; i < 4; i++) {
        free(metrics_render(m, NULL));
        pthread_join(threads[i], NULL);
    }
    render_and_parse(m);
    assert_true(value_of(&exposition, "outbox_rows_published_total", "queue", "odd") == 2000);
    assert_true(value_of(&exposition, "outbox_rows_published_total", "queue", "even") == 2000);
    assert_true(value_of(&exposition, "outbox_publish_duration_seconds_count", NULL, NULL) == 4000);
    assert_true(value_of(&exposition, "outbox_rows_in_flight", NULL, NULL) == 4000);
    metrics_free(m);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_empty_registry_is_valid), cmocka_unit_test(test_counts_add_up),
        cmocka_unit_test(test_label_escaping),          cmocka_unit_test(test_health),
        cmocka_unit_test(test_health_follows_round_trip_ages),
        cmocka_unit_test(test_null_is_ignored),         cmocka_unit_test(test_concurrent_updates),
        cmocka_unit_test(test_loop_alive_ignores_the_ends),
        cmocka_unit_test(test_horizon_age_gauge),
        cmocka_unit_test(test_stream_gauges),
        cmocka_unit_test(test_broker_endpoints),
        cmocka_unit_test(test_queue_series_are_capped),
        cmocka_unit_test(test_health_says_when_the_broker_holds_rows),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
