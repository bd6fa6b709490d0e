/*
 * fuzz_config.c - config_parse on an argv made from arbitrary bytes: the
 * input is split on NUL and newline, argv[0] is the program name.
 *
 * Invariants: 0 or -1; -1 with OUTBOX_ERR_CONFIG or OUTBOX_ERR_INTERNAL, a
 * non-empty one-line message, and a cleared config; 0 with both URLs set
 * (unless --help or --version) and values within their ranges; no message
 * shows a password given in a URL argument; config_clear frees everything
 * (LeakSanitizer checks).
 */
#include <stdbool.h>

#include <libpq-fe.h>

#include "config.h"
#include "fuzz_common.h"
#include "sink.h"
#include "url.h"

#define ARG_MAX_COUNT 64

extern char **environ;

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Runs free of any OUTBOX_* variable of the calling environment. */
int
LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    for (size_t i = 0; environ[i] != NULL;) {
        char name[256];
        size_t len = strcspn(environ[i], "=");

        if (strncmp(environ[i], "OUTBOX_", 7) == 0 && len < sizeof(name)) {
            memcpy(name, environ[i], len);
            name[len] = '\0';
            unsetenv(name);
            i = 0;
        } else {
            i++;
        }
    }
    return 0;
}

/*
 * A password that a message must never show: one given in text as a broker
 * URL or libpq conninfo, written literally, at least 6 characters, holding a
 * character no fixed message text uses (so finding it means it was echoed).
 */
static void
check_secret_hidden(const char *text, const char *input, const char *message)
{
    struct broker_url url;
    struct outbox_error err;
    PQconninfoOption *options;
    char *pq_message = NULL;

    if (sink_url_parse(text, &url, &err) == 0) {
        const char *pw = url.password;

        if (pw != NULL && strlen(pw) >= 6 && strpbrk(pw, "!$~^") != NULL &&
            fuzz_count(input, pw) == 1)
            FUZZ_CHECK(strstr(message, pw) == NULL, "message '%s' shows the password of '%s'",
                       message, text);
        url_clear(&url);
    }
    options = PQconninfoParse(text, &pq_message);
    PQfreemem(pq_message);
    if (options != NULL) {
        for (const PQconninfoOption *o = options; o->keyword != NULL; o++) {
            const char *pw = o->val;

            if (strcmp(o->keyword, "password") == 0 && pw != NULL && strlen(pw) >= 6 &&
                strpbrk(pw, "!$~^") != NULL && fuzz_count(input, pw) == 1)
                FUZZ_CHECK(strstr(message, pw) == NULL,
                           "message '%s' shows the password of '%s'", message, text);
        }
        PQconninfoFree(options);
    }
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *argv[ARG_MAX_COUNT + 1];
    struct relay_config config;
    struct outbox_error err;
    char *input = malloc(size + 1), *whole = malloc(size + 1), *p;
    int argc = 0, rc;

    if (input == NULL || whole == NULL)
        abort();
    memcpy(input, data, size);
    input[size] = '\0';
    /* the whole input as one string, for counting occurrences */
    for (size_t i = 0; i < size; i++)
        whole[i] = data[i] == '\0' ? '\n' : (char)data[i];
    whole[size] = '\0';
    argv[argc++] = "outbox-relay";
    p = input;
    for (size_t i = 0; i <= size && argc < ARG_MAX_COUNT; i++) {
        if (i == size || input[i] == '\0' || input[i] == '\n') {
            input[i] = '\0';
            argv[argc++] = p;
            p = input + i + 1;
        }
    }
    argv[argc] = NULL;

    memset(&err, 0, sizeof(err));
    rc = config_parse(&config, argc, argv, &err);
    FUZZ_CHECK(rc == 0 || rc == -1, "config_parse returned %d", rc);
    if (rc == 0) {
        if (!config.help && !config.version) {
            FUZZ_CHECK(config.database_url != NULL && config.database_url[0] != '\0',
                       "no database url");
            FUZZ_CHECK(config.broker.url != NULL && config.broker.url[0] != '\0', "no broker");
        }
        FUZZ_CHECK(config.batch_size >= 1 && config.batch_size <= 10000, "batch %d",
                   config.batch_size);
        FUZZ_CHECK(config.lease_seconds >= 5 && config.lease_seconds <= 86400, "lease %d",
                   config.lease_seconds);
        FUZZ_CHECK(config.concurrency >= 1 && config.concurrency <= 64, "concurrency %d",
                   config.concurrency);
        FUZZ_CHECK(config.poll_interval_ms >= 1 && config.poll_interval_ms <= 60000, "poll %d",
                   config.poll_interval_ms);
        FUZZ_CHECK(config.retry_base_seconds <= config.retry_max_seconds, "retry bounds");
        FUZZ_CHECK((config.queues == NULL) == (config.queue_count == 0), "queue count");
        for (size_t i = 0; i < config.queue_count; i++)
            FUZZ_CHECK(config.queues[i] != NULL && config.queues[i][0] != '\0', "queue %zu", i);
        if (config.queues != NULL)
            FUZZ_CHECK(config.queues[config.queue_count] == NULL, "queue list not terminated");
        config_clear(&config);
    } else {
        FUZZ_CHECK(err.code == OUTBOX_ERR_CONFIG || err.code == OUTBOX_ERR_INTERNAL, "code %d",
                   (int)err.code);
        fuzz_check_message(&err, "(argv)");
        FUZZ_CHECK(config.database_url == NULL && config.broker.url == NULL &&
                       config.queues == NULL && config.broker.broker_config[0] == NULL,
                   "config not cleared after a failure");
        for (int i = 1; i < argc; i++) {
            const char *value = strchr(argv[i], '=');

            check_secret_hidden(argv[i], whole, err.message);
            if (value != NULL)
                check_secret_hidden(value + 1, whole, err.message);
        }
    }
    free(whole);
    free(input);
    return 0;
}
