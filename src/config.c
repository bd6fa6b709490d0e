/*
 * config.c - the option table, parsing and --help.
 */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "parse.h"
#include "url.h"

/* How an option's text becomes a value. */
enum option_kind {
    KIND_STRING,   /* char * */
    KIND_LIST,     /* comma-separated queue names */
    KIND_INT,      /* int within [min, max] */
    KIND_INT64,    /* int64_t within [min, max] */
    KIND_SECONDS,  /* duration into double seconds, [min, max] */
    KIND_MILLIS,   /* duration into int milliseconds (int or int64 by field size) */
    KIND_FLAG,     /* bool, no argument on the command line */
    KIND_CHOICE,   /* one of the words in choices */
};

struct option_spec {
    const char *name;   /* without the leading "--" */
    const char *metavar;
    enum option_kind kind;
    size_t offset;      /* field in struct relay_config */
    size_t size;        /* field size, for KIND_MILLIS */
    const char *fallback; /* default as text, parsed like user input; NULL: none */
    double min;
    double max;
    const char *choices; /* KIND_CHOICE: "a|b" */
    const char *help;
    /*
     * Read from OUTBOX_<NAME> too. Settings are; the action flags (--once,
     * --check, --help, --version) are not: a variable left in a service's
     * environment must not turn a normal start into something else.
     */
    bool from_environment;
};

#define FROM_ENVIRONMENT true
#define COMMAND_LINE_ONLY false

#define FIELD(f) offsetof(struct relay_config, f), sizeof(((struct relay_config *)0)->f)

static const struct option_spec OPTIONS[] = {
    {"database-url", "URL", KIND_STRING, FIELD(database_url), NULL, 0, 0, NULL,
     "PostgreSQL database holding outbox.job (libpq URI or conninfo); required", FROM_ENVIRONMENT},
    {"broker", "URL", KIND_STRING, FIELD(broker_url), NULL, 0, 0, NULL,
     "amqp://user:pass@host:port[,host2:port2...]/vhost, amqps://..., redis://[:pass@]host:port[/db],"
     " redis+sentinel://[user:pass@]s1:p1,s2:p2/MASTER[/db] or redis+cluster://[user:pass@]h1:p1,...;"
     " required", FROM_ENVIRONMENT},
    {"broker-password-file", "PATH", KIND_STRING, FIELD(broker_password_file), NULL, 0, 0, NULL,
     "the broker password, read from this file (out of the process list); overrides one in"
     " --broker", FROM_ENVIRONMENT},
    {"queues", "A,B", KIND_LIST, FIELD(queues), NULL, 0, 0, NULL,
     "publish only these queues (default: every queue)", FROM_ENVIRONMENT},
    {"exchange", "NAME", KIND_STRING, FIELD(exchange), "", 0, 0, NULL,
     "AMQP exchange of rows without their own (default: the default exchange)", FROM_ENVIRONMENT},
    {"stream-prefix", "P", KIND_STRING, FIELD(stream_prefix), "", 0, 0, NULL,
     "Redis stream key = P + the row's routing key, else its queue", FROM_ENVIRONMENT},
    {"batch-size", "N", KIND_INT, FIELD(batch_size), "500", 1, 10000, NULL,
     "rows claimed per claim", FROM_ENVIRONMENT},
    {"lease", "SECONDS", KIND_INT, FIELD(lease_seconds), "60", 5, 86400, NULL,
     "lease length; rows of a relay that dies are retried after it", FROM_ENVIRONMENT},
    {"concurrency", "N", KIND_INT, FIELD(concurrency), "2", 1, 64, NULL,
     "parallel claim/publish pipelines, each with its own connections", FROM_ENVIRONMENT},
    {"metrics-addr", "HOST:PORT", KIND_STRING, FIELD(metrics_addr), "127.0.0.1:9187", 0, 0, NULL,
     "serve /metrics and /healthz here; 'off' disables", FROM_ENVIRONMENT},
    {"once", NULL, KIND_FLAG, FIELD(once), NULL, 0, 0, NULL,
     "reap, publish until nothing is claimable now, then exit 0; exit 1 when the database or"
     " the broker stays unreachable for 10 s", COMMAND_LINE_ONLY},
    {"check", NULL, KIND_FLAG, FIELD(check), NULL, 0, 0, NULL,
     "validate the configuration, connect to both ends, check the role's privileges and that"
     " --exchange exists, print 'configuration OK'", COMMAND_LINE_ONLY},
    {"poll-interval", "DURATION", KIND_MILLIS, FIELD(poll_interval_ms), "100ms", 1, 60000, NULL,
     "longest wait between claims while idle (a new row is seen within about this)", FROM_ENVIRONMENT},
    {"retry-base", "DURATION", KIND_SECONDS, FIELD(retry_base_seconds), "1s", 0, 86400, NULL,
     "first retry delay after a failed publish; doubles per attempt, with jitter", FROM_ENVIRONMENT},
    {"retry-max", "DURATION", KIND_SECONDS, FIELD(retry_max_seconds), "5m", 0, 604800, NULL,
     "longest retry delay", FROM_ENVIRONMENT},
    {"retention", "DURATION", KIND_SECONDS, FIELD(retention_seconds), CONFIG_RETENTION_DEFAULT,
     0, 31536000, NULL, "delete succeeded rows older than this; 0 keeps them", FROM_ENVIRONMENT},
    {"dedup-window", "DURATION", KIND_MILLIS, FIELD(dedup_window_ms), "24h", 1, 31536000000.0,
     NULL, "Redis: a job is appended at most once per stream within this window", FROM_ENVIRONMENT},
    {"stream-maxlen", "N", KIND_INT64, FIELD(stream_maxlen), "0", 0, 1e15, NULL,
     "Redis: trim each stream to about N entries (MAXLEN ~); 0 never trims", FROM_ENVIRONMENT},
    {"redis-wait", "N", KIND_INT, FIELD(redis_wait), "0", 0, 100, NULL,
     "Redis: mark a row only once N replicas acknowledged its append (WAIT N 1000)",
     FROM_ENVIRONMENT},
    {"max-message-bytes", "N", KIND_INT64, FIELD(max_message_bytes), "134217728", 1, 2147483647,
     NULL, "larger payloads fail at once as dead rows (RabbitMQ's default limit is 128 MiB)", FROM_ENVIRONMENT},
    {"ordering-dead-policy", "skip|block", KIND_CHOICE, FIELD(block_on_dead_head), "skip", 0, 0,
     "skip|block", "whether a dead row stops later rows of its ordering key", FROM_ENVIRONMENT},
    {"on-success", "mark|delete", KIND_CHOICE, FIELD(delete_on_success), "mark", 0, 0,
     "mark|delete", "a published row: mark it succeeded (kept for --retention) or delete it now",
     FROM_ENVIRONMENT},
    {"tls-verify", "yes|no", KIND_CHOICE, FIELD(tls_verify), "yes", 0, 0, "no|yes",
     "amqps: verify the broker's certificate and host name", FROM_ENVIRONMENT},
    {"log-level", "LEVEL", KIND_CHOICE, FIELD(log_level), "info", 0, 0, "debug|info|warn|error",
     "least severe level logged", FROM_ENVIRONMENT},
    {"log-format", "text|json", KIND_CHOICE, FIELD(log_format), "text", 0, 0, "text|json",
     "log line format", FROM_ENVIRONMENT},
    {"horizon-warning", "DURATION", KIND_SECONDS, FIELD(horizon_warning_seconds), "5m", 0,
     31536000, NULL, "warn when an open transaction holds back vacuum longer than this", FROM_ENVIRONMENT},
    {"help", NULL, KIND_FLAG, FIELD(help), NULL, 0, 0, NULL, "print this help and exit", COMMAND_LINE_ONLY},
    {"version", NULL, KIND_FLAG, FIELD(version), NULL, 0, 0, NULL, "print the version and exit", COMMAND_LINE_ONLY},
};

#define OPTION_COUNT (sizeof(OPTIONS) / sizeof(OPTIONS[0]))

/* Longest exchange name AMQP can carry. */
#define CONFIG_EXCHANGE_MAX 255

/* Longest user text quoted back in a message. */
#define QUOTE_MAX 60

/*
 * Copies text for a message into out (QUOTE_MAX + 1 bytes): passwords
 * redacted as url_redact does, also in whatever follows the first '='
 * (as in "--database-url=URL"), at most QUOTE_MAX characters, control
 * characters as '?', so a message never shows a password and stays one
 * line.
 */
static const char *
quote(const char *text, char *out)
{
    char *redacted = url_redact(text), *value = NULL, *rest = NULL;
    size_t n = 0;

    /* "name=URL" is not a conninfo url_redact reads a password from: redact the URL too */
    if (redacted != NULL && (value = strchr(redacted, '=')) != NULL)
        rest = url_redact(value + 1);
    if (redacted == NULL || (value != NULL && rest == NULL)) {
        free(redacted);
        snprintf(out, QUOTE_MAX + 1, "...");
        return out;
    }
    if (value != NULL) {
        n = (size_t)(value + 1 - redacted) < QUOTE_MAX ? (size_t)(value + 1 - redacted) : QUOTE_MAX;
        memcpy(out, redacted, n);
        for (size_t i = 0; rest[i] != '\0' && n < QUOTE_MAX; i++)
            out[n++] = rest[i];
    } else {
        for (size_t i = 0; redacted[i] != '\0' && n < QUOTE_MAX; i++)
            out[n++] = redacted[i];
    }
    out[n] = '\0';
    free(rest);
    free(redacted);
    return outbox_error_quote(out, n + 1, out); /* in place */
}

/* Environment name of an option: OUTBOX_ + upper-case name, '-' as '_'. */
static void
env_name(const struct option_spec *spec, char *out, size_t size)
{
    size_t n = (size_t)snprintf(out, size, "OUTBOX_");

    for (const char *p = spec->name; *p != '\0' && n + 1 < size; p++)
        out[n++] = *p == '-' ? '_' : (char)toupper((unsigned char)*p);
    out[n] = '\0';
}

/* Frees one option's current value. */
static void
clear_value(struct relay_config *config, const struct option_spec *spec)
{
    char *base = (char *)config + spec->offset;

    if (spec->kind == KIND_STRING) {
        free(*(char **)base);
        *(char **)base = NULL;
    } else if (spec->kind == KIND_LIST) {
        char **list = *(char ***)base;

        for (size_t i = 0; list != NULL && list[i] != NULL; i++)
            free(list[i]);
        free(list);
        *(char ***)base = NULL;
        config->queue_count = 0;
    }
}

/* A queue name as the schema allows it: 1-200 of [A-Za-z0-9._:-]. */
static bool
queue_name_valid(const char *name, size_t len)
{
    if (len == 0 || len > 200)
        return false;
    for (size_t i = 0; i < len; i++) {
        char c = name[i];

        if (!isalnum((unsigned char)c) && c != '.' && c != '_' && c != ':' && c != '-')
            return false;
    }
    return true;
}

/* Sets one option from text; `source` names it in errors ("--lease" or "OUTBOX_LEASE"). */
static int
set_value(struct relay_config *config, const struct option_spec *spec, const char *text,
          const char *source, struct outbox_error *err)
{
    char *base = (char *)config + spec->offset;
    char quoted[QUOTE_MAX + 1];
    char *end;

    switch (spec->kind) {
    case KIND_STRING: {
        char *copy = strdup(text);

        if (copy == NULL)
            return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
        clear_value(config, spec);
        *(char **)base = copy;
        return 0;
    }
    case KIND_LIST: {
        size_t count = 0, i = 0;
        char **list;
        const char *p = text;

        clear_value(config, spec);
        for (const char *q = text; *q != '\0'; q++)
            count += *q == ',';
        list = calloc(count + 2, sizeof(*list));
        if (list == NULL)
            return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
        *(char ***)base = list;
        for (;;) {
            size_t len = strcspn(p, ",");

            if (!queue_name_valid(p, len)) {
                char *name = strndup(p, len);

                if (name == NULL)
                    return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
                outbox_error_set(err, OUTBOX_ERR_CONFIG,
                                 "%s: invalid queue name '%s' (1-200 characters of"
                                 " A-Z a-z 0-9 . _ : -)",
                                 source, quote(name, quoted));
                free(name);
                return -1;
            }
            list[i] = strndup(p, len);
            if (list[i] == NULL)
                return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
            config->queue_count = ++i;
            if (p[len] == '\0')
                break;
            p += len + 1;
        }
        return 0;
    }
    case KIND_INT:
    case KIND_INT64: {
        long long value;

        errno = 0;
        value = strtoll(text, &end, 10);
        if (errno != 0 || end == text || *end != '\0' || value < spec->min || value > spec->max)
            return outbox_error_set(err, OUTBOX_ERR_CONFIG,
                                    "%s: expected a whole number from %.0f to %.0f, got '%s'",
                                    source, spec->min, spec->max, quote(text, quoted));
        if (spec->kind == KIND_INT)
            *(int *)base = (int)value;
        else
            *(int64_t *)base = value;
        return 0;
    }
    case KIND_SECONDS:
    case KIND_MILLIS: {
        int64_t ms = 0;
        double value;

        if (parse_duration_ms(text, &ms, NULL) != 0)
            ms = -1;
        value = spec->kind == KIND_MILLIS ? (double)ms : (double)ms / 1000.0;
        if (ms < 0 || value < spec->min || value > spec->max)
            return outbox_error_set(err, OUTBOX_ERR_CONFIG,
                                    "%s: expected a duration such as 250ms, 30s, 15m, 24h or 7d"
                                    " within range, got '%s'",
                                    source, quote(text, quoted));
        if (spec->kind == KIND_SECONDS)
            memcpy(base, &value, sizeof(value)); /* the field is a double */
        else if (spec->size == sizeof(int64_t))
            *(int64_t *)base = (int64_t)llround(value);
        else
            *(int *)base = (int)lround(value);
        return 0;
    }
    case KIND_FLAG:
        if (strcmp(text, "1") == 0 || strcmp(text, "true") == 0 || strcmp(text, "yes") == 0 ||
            strcmp(text, "on") == 0)
            *(bool *)base = true;
        else if (strcmp(text, "0") == 0 || strcmp(text, "false") == 0 ||
                 strcmp(text, "no") == 0 || strcmp(text, "off") == 0 || text[0] == '\0')
            *(bool *)base = false;
        else
            return outbox_error_set(err, OUTBOX_ERR_CONFIG,
                                    "%s: expected true or false, got '%s'", source,
                                    quote(text, quoted));
        return 0;
    case KIND_CHOICE: {
        const char *choices = spec->choices;
        int index = 0;

        for (const char *p = choices;; index++) {
            size_t len = strcspn(p, "|");

            if (strlen(text) == len && strncmp(p, text, len) == 0)
                break;
            if (p[len] == '\0')
                return outbox_error_set(err, OUTBOX_ERR_CONFIG,
                                        "%s: expected one of %s, got '%s'", source, choices,
                                        quote(text, quoted));
            p += len + 1;
        }
        /* choices map to their index: a bool field takes "no|yes"-style pairs */
        if (spec->size == sizeof(bool))
            *(bool *)base = index == 1;
        else
            *(int *)base = index;
        return 0;
    }
    }
    return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "unknown option kind");
}

/* Longest password file read. */
#define PASSWORD_FILE_MAX 4096

/*
 * Reads the password in path into *password (malloc'd): the whole file but
 * one trailing newline ("\n" or "\r\n"). An unreadable, empty or oversized
 * file, or one holding a NUL or a line break inside, is an error naming
 * --broker-password-file; the file's content is never quoted.
 */
static int
read_password_file(const char *path, char **password, struct outbox_error *err)
{
    char quoted[QUOTE_MAX + 1];
    char *text = malloc(PASSWORD_FILE_MAX + 2);
    FILE *file;
    size_t len;
    int saved_errno;

    if (text == NULL)
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    file = fopen(path, "r");
    if (file == NULL) {
        saved_errno = errno;
        free(text);
        return outbox_error_set(err, OUTBOX_ERR_CONFIG, "--broker-password-file: unable to read"
                                " '%s': %s", quote(path, quoted), strerror(saved_errno));
    }
    len = fread(text, 1, PASSWORD_FILE_MAX + 1, file);
    saved_errno = ferror(file) ? errno : 0;
    fclose(file);
    if (saved_errno != 0 || len > PASSWORD_FILE_MAX) {
        free(text);
        return outbox_error_set(err, OUTBOX_ERR_CONFIG, "--broker-password-file: unable to read"
                                " '%s': %s", quote(path, quoted),
                                saved_errno != 0 ? strerror(saved_errno) : "longer than 4096 bytes");
    }
    if (len > 0 && text[len - 1] == '\n')
        len--;
    if (len > 0 && text[len - 1] == '\r')
        len--;
    text[len] = '\0';
    if (len == 0 || memchr(text, '\0', len) != NULL || strpbrk(text, "\r\n") != NULL) {
        memset(text, 0, len);
        free(text);
        return outbox_error_set(err, OUTBOX_ERR_CONFIG,
                                "--broker-password-file: '%s' %s", quote(path, quoted),
                                len == 0 ? "is empty" : "holds more than one line");
    }
    *password = text;
    return 0;
}

static const struct option_spec *
find_option(const char *name, size_t len)
{
    for (size_t i = 0; i < OPTION_COUNT; i++)
        if (strlen(OPTIONS[i].name) == len && strncmp(OPTIONS[i].name, name, len) == 0)
            return &OPTIONS[i];
    return NULL;
}

int
config_parse(struct relay_config *config, int argc, const char *const *argv,
             struct outbox_error *err)
{
    char source[64];
    char quoted[QUOTE_MAX + 1];
    /* per option, the command line's value (the last one given), or NULL */
    const char *given[OPTION_COUNT] = {NULL};

    memset(config, 0, sizeof(*config));

    /* the command line is read first, so the variables it overrides are never read */
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i], *name, *value = NULL;
        const struct option_spec *spec;
        size_t len;

        if (strncmp(arg, "--", 2) != 0 || arg[2] == '\0') {
            outbox_error_set(err, OUTBOX_ERR_CONFIG, "unexpected argument '%s' (options start"
                             " with --; see --help)", quote(arg, quoted));
            goto fail;
        }
        name = arg + 2;
        len = strcspn(name, "=");
        if (name[len] == '=')
            value = name + len + 1;
        spec = find_option(name, len);
        if (spec == NULL) {
            char *unknown = strndup(name, len);

            if (unknown == NULL) {
                outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
                goto fail;
            }
            outbox_error_set(err, OUTBOX_ERR_CONFIG, "unknown option '--%s' (see --help)",
                             quote(unknown, quoted));
            free(unknown);
            goto fail;
        }
        if (spec->kind == KIND_FLAG) {
            if (value == NULL)
                value = "true";
        } else if (value == NULL) {
            if (i + 1 >= argc) {
                outbox_error_set(err, OUTBOX_ERR_CONFIG, "--%s needs a value (%s)", spec->name,
                                 spec->metavar);
                goto fail;
            }
            value = argv[++i];
        }
        given[spec - OPTIONS] = value;
    }

    /* defaults, then the environment, then the command line */
    for (size_t i = 0; i < OPTION_COUNT; i++) {
        if (OPTIONS[i].fallback != NULL &&
            set_value(config, &OPTIONS[i], OPTIONS[i].fallback, OPTIONS[i].name, err) != 0)
            goto fail;
    }
    for (size_t i = 0; i < OPTION_COUNT; i++) {
        const char *value;

        if (given[i] != NULL || !OPTIONS[i].from_environment)
            continue;
        env_name(&OPTIONS[i], source, sizeof(source));
        value = getenv(source);
        if (value != NULL && set_value(config, &OPTIONS[i], value, source, err) != 0)
            goto fail;
    }
    for (size_t i = 0; i < OPTION_COUNT; i++) {
        if (given[i] == NULL)
            continue;
        snprintf(source, sizeof(source), "--%s", OPTIONS[i].name);
        if (set_value(config, &OPTIONS[i], given[i], source, err) != 0)
            goto fail;
    }
    if (config->help || config->version)
        return 0;

    if (config->database_url == NULL || config->database_url[0] == '\0') {
        outbox_error_set(err, OUTBOX_ERR_CONFIG,
                         "--database-url is required (or OUTBOX_DATABASE_URL)");
        goto fail;
    }
    if (config->broker_url == NULL || config->broker_url[0] == '\0') {
        outbox_error_set(err, OUTBOX_ERR_CONFIG, "--broker is required (or OUTBOX_BROKER)");
        goto fail;
    }
    {
        struct outbox_error url_err;

        if (url_check_database(config->database_url, &url_err) != 0) {
            outbox_error_set(err, OUTBOX_ERR_CONFIG, "--database-url: %s", url_err.message);
            goto fail;
        }
    }
    {
        struct broker_url url;
        struct outbox_error url_err;

        if (url_parse(config->broker_url, &url, &url_err) != 0) {
            outbox_error_set(err, OUTBOX_ERR_CONFIG, "--broker: %s", url_err.message);
            goto fail;
        }
        url_clear(&url);
    }
    if (config->broker_password_file != NULL &&
        read_password_file(config->broker_password_file, &config->broker_password, err) != 0)
        goto fail;
    /* AMQP's shortstr: the broker would close the connection on a longer one */
    if (strlen(config->exchange) > CONFIG_EXCHANGE_MAX) {
        outbox_error_set(err, OUTBOX_ERR_CONFIG, "--exchange: longer than %d bytes (%zu)",
                         CONFIG_EXCHANGE_MAX, strlen(config->exchange));
        goto fail;
    }
    if (config->retry_max_seconds < config->retry_base_seconds) {
        outbox_error_set(err, OUTBOX_ERR_CONFIG, "--retry-max must not be below --retry-base");
        goto fail;
    }
    if (config->once && config->check) {
        outbox_error_set(err, OUTBOX_ERR_CONFIG, "--once and --check exclude each other");
        goto fail;
    }
    return 0;

fail:
    config_clear(config);
    return -1;
}

void
config_clear(struct relay_config *config)
{
    if (config == NULL)
        return;
    if (config->broker_password != NULL) {
        memset(config->broker_password, 0, strlen(config->broker_password));
        free(config->broker_password);
    }
    for (size_t i = 0; i < OPTION_COUNT; i++)
        clear_value(config, &OPTIONS[i]);
    memset(config, 0, sizeof(*config));
}

void
config_usage(FILE *out)
{
    size_t only = 0, shown = 0;

    fputs("usage: outbox-relay --database-url URL --broker URL [options]\n"
          "\n"
          "Publishes committed rows of outbox.job to RabbitMQ or Redis Streams.\n"
          "Every option that takes a value can also be set as OUTBOX_<NAME> in the\n"
          "environment (--batch-size as OUTBOX_BATCH_SIZE); the command line wins and\n"
          "its variable is then not read.",
          out);
    for (size_t i = 0; i < OPTION_COUNT; i++)
        only += !OPTIONS[i].from_environment;
    for (size_t i = 0; i < OPTION_COUNT; i++) {
        if (OPTIONS[i].from_environment)
            continue;
        shown++;
        fprintf(out, "%s--%s", shown == 1 ? (only > 1 ? " " : " Only ") :
                               shown == only ? " and " : ", ", OPTIONS[i].name);
    }
    if (only > 0)
        fputs(only > 1 ? " are read\nfrom the command line only." : " is read from the command line only.", out);
    fputs("\n\noptions:\n", out);
    for (size_t i = 0; i < OPTION_COUNT; i++) {
        const struct option_spec *spec = &OPTIONS[i];
        char left[64];

        snprintf(left, sizeof(left), "--%s%s%s", spec->name, spec->metavar ? " " : "",
                 spec->metavar ? spec->metavar : "");
        fprintf(out, "  %-30s %s", left, spec->help);
        if (spec->fallback != NULL && spec->fallback[0] != '\0' && spec->kind != KIND_FLAG)
            fprintf(out, " [%s]", spec->fallback);
        fputc('\n', out);
    }
    fputs("\nexit status: 0 clean stop, 1 runtime error, 2 usage or configuration error\n", out);
}
