/*
 * outboxctl enqueue: adds one job by hand, its payload given inline or read
 * from a file or stdin (at most 256 MiB, no NUL byte), and prints its id; a
 * known idempotency key prints the existing job's id.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl.h"
#include "outbox.h"

/* The largest payload file read: PostgreSQL's jsonb stops at 255 MiB. */
#define PAYLOAD_FILE_MAX ((size_t)256 * 1024 * 1024)

/*
 * Reads the payload from path ("-" for stdin) into *payload (malloc'd).
 * Returns 0, or an exit code after the message.
 */
static int
read_payload_file(const char *path, char **payload)
{
    bool from_stdin = strcmp(path, "-") == 0;
    FILE *file = from_stdin ? stdin : fopen(path, "rb");
    size_t len = 0, capacity = 64 * 1024;
    char *text;

    if (file == NULL)
        return ctl_usage_error("--payload-file: unable to read '%s': %s", path, strerror(errno));
    text = malloc(capacity + 1);
    while (text != NULL) {
        size_t got = fread(text + len, 1, capacity - len, file);

        len += got;
        if (len < capacity) {
            if (ferror(file)) {
                int saved_errno = errno;

                free(text);
                if (!from_stdin)
                    fclose(file);
                return ctl_usage_error("--payload-file: unable to read '%s': %s", path,
                                       strerror(saved_errno));
            }
            break; /* end of file */
        }
        if (capacity >= PAYLOAD_FILE_MAX) {
            free(text);
            if (!from_stdin)
                fclose(file);
            return ctl_usage_error("--payload-file: '%s' is larger than 256 MiB", path);
        }
        {
            char *bigger = realloc(text, capacity * 2 + 1);

            if (bigger == NULL) {
                free(text);
                text = NULL;
                break;
            }
            text = bigger;
            capacity *= 2;
        }
    }
    if (!from_stdin)
        fclose(file);
    if (text == NULL)
        return ctl_out_of_memory();
    text[len] = '\0';
    if (memchr(text, '\0', len) != NULL) {
        free(text);
        return ctl_usage_error("--payload-file: '%s' holds a NUL byte, not JSON text", path);
    }
    *payload = text;
    return 0;
}

int
ctl_command_enqueue(struct ctl *ctl, int argc, char **argv, int first)
{
    struct outbox_message message = {0};
    const char *payload_file = NULL;
    char *file_payload = NULL;
    int64_t job_id = 0;
    struct outbox_error err;
    int taken;

    const struct ctl_option options[] = {{"--queue", &message.queue, NULL},
                                         {"--payload", &message.payload_json, NULL},
                                         {"--payload-file", &payload_file, NULL},
                                         {"--idempotency-key", &message.idempotency_key, NULL},
                                         {"--key", &message.idempotency_key, NULL},
                                         {"--exchange", &message.exchange, NULL},
                                         {"--routing-key", &message.routing_key, NULL}};

    if ((taken = ctl_parse_options(ctl, argc, argv, first, options, 7)) != CTL_GO_ON)
        return taken;
    if (message.queue == NULL)
        return ctl_usage_error("'enqueue' needs --queue Q");
    if ((taken = ctl_check_queue_and_key(message.queue, NULL)) != 0)
        return taken;
    if (message.payload_json != NULL && payload_file != NULL)
        return ctl_usage_error("'enqueue' takes --payload or --payload-file, not both");
    if (message.payload_json == NULL && payload_file == NULL)
        return ctl_usage_error("'enqueue' needs --payload JSON or --payload-file PATH");
    if (payload_file != NULL) {
        if ((taken = read_payload_file(payload_file, &file_payload)) != 0)
            return taken;
        message.payload_json = file_payload;
    }
    if ((taken = ctl_connect(ctl)) != 0)
        goto done;
    if (store_admin_check_schema(ctl->conn, &err) < 0 ||
        store_admin_enqueue(ctl->conn, &message, &job_id, &err) < 0) {
        taken = ctl_runtime_error(ctl, &err);
        goto done;
    }
    printf("%lld\n", (long long)job_id);
    taken = 0;
done:
    free(file_payload);
    return taken;
}
