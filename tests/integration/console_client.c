/*
 * console_client.c - the tests' HTTP client for the console and the
 * console started and stopped around a test (see console_client.h).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "console_client.h"
#include "fixtures.h"
#include "harness.h"

struct http_reply
console_get(int port, const char *path)
{
    return http_request(port, "GET", path, CONSOLE_BEARER, NULL, 20);
}

struct http_reply
console_post(int port, const char *path, const char *body)
{
    return http_request(port, "POST", path, CONSOLE_BEARER "Content-Type: application/json\r\n",
                        body, 20);
}

void
console_token_file(char *path, size_t size, const char *name)
{
    FILE *file;

    snprintf(path, size, "/tmp/outbox-%s-token-%d", name, (int)getpid());
    file = fopen(path, "w");
    assert_non_null(file);
    fputs(CONSOLE_TOKEN "\n", file);
    fclose(file);
    assert_int_equal(chmod(path, 0600), 0);
}

/*
 * Starts outboxctl with the words of before (NULL-terminated) ending in
 * "serve", then --listen 127.0.0.1:port and options; waits until it answers.
 */
static pid_t
start(int port, const char *const *before, const char *const *options)
{
    char listen[32], bin[512], *log;
    const char *argv[24];
    pid_t pid;
    int n = 0;

    snprintf(listen, sizeof(listen), "127.0.0.1:%d", port);
    snprintf(bin, sizeof(bin), "%s/outboxctl", harness_env("OUTBOX_BIN"));
    argv[n++] = bin;
    for (int i = 0; before[i] != NULL && n < 8; i++)
        argv[n++] = before[i];
    argv[n++] = "--listen";
    argv[n++] = listen;
    for (int i = 0; options[i] != NULL && n < 23; i++)
        argv[n++] = options[i];
    argv[n] = NULL;
    log = harness_log_path("console");
    pid = harness_spawn(argv, log);
    free(log);
    for (int waited = 0; waited < 10000 * harness_time_scale(); waited += 50) {
        struct http_reply r = http_request(port, "GET", "/static/console.css", NULL, NULL, 20);
        int status = r.status;

        http_reply_free(&r);
        if (status != 0)
            return pid;
        usleep(50 * 1000);
    }
    fail_msg("the console did not answer on port %d", port);
    return pid;
}

pid_t
console_start(int port, const char *url, const char *const *options)
{
    const char *before[] = {"serve", "--database-url", url, NULL};

    return start(port, before, options);
}

pid_t
console_start_list(int port, const char *list_path, const char *const *options)
{
    const char *before[] = {"--databases", list_path, "serve", NULL};

    return start(port, before, options);
}

void
console_stop(pid_t pid)
{
    if (pid > 0) {
        kill(pid, SIGTERM);
        assert_int_equal(harness_wait_exit(pid, 10000 * harness_time_scale()), 0);
    }
}

void
console_expect(const struct http_reply *reply, int status, const char *body_part)
{
    if (reply->status != status || (body_part && strstr(reply->body, body_part) == NULL))
        fail_msg("expected %d with '%s', got %d: %s", status, body_part ? body_part : "",
                 reply->status, reply->body ? reply->body : "(no answer)");
}
