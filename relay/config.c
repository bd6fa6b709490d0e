/*
 * config.c - the option table, parsing and --help.
 */
#include "config.h"
#include "timeouts.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "cloudevents.h"
#include "database_list.h"
#include "error.h"
#include "parse.h"
#include "url.h"

#define FROM_ENVIRONMENT OPTION_FROM_ENVIRONMENT
#define COMMAND_LINE_ONLY OPTION_COMMAND_LINE_ONLY
#define FIELD(f) OPTION_FIELD(struct relay_config, f)

/* The longest queue name the schema takes (sql/002_queue_name_check.sql). */
#define QUEUE_NAME_MAX 200
/* --help: the width of an option's name column, its text after it */
#define USAGE_NAME_WIDTH 30

/* --check's help, with what each broker's check verifies (see check_help). */
static char check_help_text[256];

/* The relay's own options; each broker's come from the sink registry. */
static const struct option_spec OPTIONS[] = {
    {"database-url", "URL", OPTION_STRING, FIELD(database_url), NULL, 0, 0, NULL,
     "PostgreSQL database holding outbox.job (libpq URI or conninfo); required unless --databases",
     FROM_ENVIRONMENT, 0},
    {"databases", "FILE", OPTION_STRING, FIELD(databases_file), NULL, 0, 0, NULL,
     "serve every database listed in FILE ('NAME URL' or a bare URL a line, '#' comments),"
     " re-read when it changes; excludes --database-url", FROM_ENVIRONMENT, 0},
    {"max-db-connections", "N", OPTION_INT, FIELD(max_db_connections), "8", 1, 1024, NULL,
     "most connections held to the databases at once, stream queues included; with"
     " --databases each is also a slot", FROM_ENVIRONMENT, 0},
    {"queues", "A,B", OPTION_LIST, FIELD(queues), NULL, 0, 0, NULL,
     "publish only these queues (default: every queue)", FROM_ENVIRONMENT, 0},
    {"batch-size", "N", OPTION_INT, FIELD(batch_size), "500", 1, 10000, NULL,
     "rows claimed per claim", FROM_ENVIRONMENT, 0},
    {"lease", "SECONDS", OPTION_INT, FIELD(lease_seconds), "60", 5, 86400, NULL,
     "lease length; rows of a relay that dies are retried after it", FROM_ENVIRONMENT, 0},
    {"concurrency", "N", OPTION_INT, FIELD(concurrency), "2", 1, 64, NULL,
     "slots publishing the database's rows side by side, each with its database and broker"
     " connection, beside one for maintenance (all within --max-db-connections); with"
     " --databases, the most slots one database's rows take at once", FROM_ENVIRONMENT, 0},
    {"metrics-addr", "HOST:PORT", OPTION_STRING, FIELD(metrics_addr), "127.0.0.1:9187", 0, 0, NULL,
     "serve /metrics and /healthz here; 'off' disables", FROM_ENVIRONMENT, 0},
    {"metrics-max-queues", "N", OPTION_INT, FIELD(metrics_max_queues), "100", 0, 1000000, NULL,
     "queues with their own /metrics series; later ones are summed under queue=\"(other)\";"
     " 0: no cap", FROM_ENVIRONMENT, 0},
    {"once", NULL, OPTION_FLAG, FIELD(once), NULL, 0, 0, NULL,
     "reap, publish until nothing is claimable now, then exit 0; exit 1 when the database or"
     " the broker stays unreachable for 10 s", COMMAND_LINE_ONLY, 0},
    {"check", NULL, OPTION_FLAG, FIELD(check), NULL, 0, 0, NULL, check_help_text,
     COMMAND_LINE_ONLY, 0},
    {"healthcheck", NULL, OPTION_FLAG, FIELD(healthcheck), NULL, 0, 0, NULL,
     "ask /healthz of the relay serving --metrics-addr (a wildcard address on loopback): exit 0"
     " when healthy, 1 when not; a container's health check", COMMAND_LINE_ONLY, 0},
    {"poll-interval", "DURATION", OPTION_MILLIS, FIELD(poll_interval_ms), "100ms", 1, 60000, NULL,
     "longest wait between claims while idle (a new row is seen within about this)", FROM_ENVIRONMENT, 0},
    {"broker-connect-timeout", "DURATION", OPTION_MILLIS, FIELD(broker_connect_timeout_ms),
     TIMEOUT_TEXT(TIMEOUT_BROKER_CONNECT_SECONDS) "s", 1000, 300000, NULL,
     "longest connect and handshake (TCP, TLS, login) with one broker endpoint, 1s to 5m",
     FROM_ENVIRONMENT, 0},
    {"broker-io-timeout", "DURATION", OPTION_MILLIS, FIELD(broker_io_timeout_ms),
     TIMEOUT_TEXT(TIMEOUT_BROKER_IO_SECONDS) "s", 1000, 300000, NULL,
     "longest wait for the broker without progress (a confirm, an ack, a reply), 1s to 5m;"
     " keep it well under --lease", FROM_ENVIRONMENT, 0},
    {"retry-base", "DURATION", OPTION_SECONDS, FIELD(retry_base_seconds), "1s", 0, 86400, NULL,
     "first retry delay after a failed publish; doubles per attempt, with jitter", FROM_ENVIRONMENT, 0},
    {"retry-max", "DURATION", OPTION_SECONDS, FIELD(retry_max_seconds), "5m", 0, 604800, NULL,
     "longest retry delay", FROM_ENVIRONMENT, 0},
    {"retention", "DURATION", OPTION_SECONDS, FIELD(retention_seconds), CONFIG_RETENTION_DEFAULT,
     0, 31536000, NULL, "delete succeeded rows older than this; 0 keeps them", FROM_ENVIRONMENT, 0},
    {"ordering-dead-policy", "skip|block", OPTION_CHOICE, FIELD(block_on_dead_head), "skip", 0, 0,
     "skip|block", "whether a dead row stops later rows of its ordering key", FROM_ENVIRONMENT, 0},
    {"on-success", "mark|delete", OPTION_CHOICE, FIELD(delete_on_success), "mark", 0, 0,
     "mark|delete", "a published row: mark it succeeded (kept for --retention) or delete it now",
     FROM_ENVIRONMENT, 0},
    {"log-level", "LEVEL", OPTION_CHOICE, FIELD(log_level), "info", 0, 0, "debug|info|warn|error",
     "least severe level logged", FROM_ENVIRONMENT, 0},
    {"log-format", "text|json", OPTION_CHOICE, FIELD(log_format), "text", 0, 0, "text|json",
     "log line format", FROM_ENVIRONMENT, 0},
    {"cloudevents", CLOUDEVENTS_CHOICES, OPTION_CHOICE, FIELD(cloudevents), "off", 0, 0,
     CLOUDEVENTS_CHOICES, "publish each row as a CloudEvent 1.0: attributes as headers of the"
     " broker's binding (binary) or the whole event as the body (structured); off: messages"
     " unchanged", FROM_ENVIRONMENT, 0},
    {"cloudevents-source", "URI", OPTION_STRING, FIELD(cloudevents_source), NULL, 0, 0, NULL,
     "the CloudEvents 'source' attribute (default: urn:outbox:<database id>)", FROM_ENVIRONMENT,
     2048},
    {"otel-endpoint", "URL", OPTION_STRING, FIELD(otel_endpoint), NULL, 0, 0, NULL,
     "export a span per published message over OTLP/HTTP to this http:// collector (default:"
     " OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, OTEL_EXPORTER_OTLP_ENDPOINT; none: no spans)",
     FROM_ENVIRONMENT, 1000},
    {"horizon-warning", "DURATION", OPTION_SECONDS, FIELD(horizon_warning_seconds), "5m", 0,
     31536000, NULL, "warn when an open transaction holds back vacuum longer than this", FROM_ENVIRONMENT, 0},
    {"help", NULL, OPTION_FLAG, FIELD(help), NULL, 0, 0, NULL, "print this help and exit", COMMAND_LINE_ONLY, 0},
    {"version", NULL, OPTION_FLAG, FIELD(version), NULL, 0, 0, NULL, "print the version and exit", COMMAND_LINE_ONLY, 0},
};

#define OPTION_COUNT (sizeof(OPTIONS) / sizeof(OPTIONS[0]))

/*
 * One option as parsing sees it: its row, the struct its offset is into
 * (struct relay_config for the relay's rows, else the registry's group:
 * see sink_option_group_target), and the --help group it is listed in.
 */
struct option_entry {
    const struct option_spec *spec;
    size_t sink_group; /* the registry's group index; unused for the relay's rows */
    const char *group; /* NULL: the relay's own */
};

/* Room for the relay's rows and every broker's. */
#define ENTRIES_MAX 64

/* Writes --check's help into check_help_text, once, with the brokers' checks from the registry. */
static void
check_help(void)
{
    const char *brokers = sink_check_help();

    if (check_help_text[0] != '\0')
        return;
    snprintf(check_help_text, sizeof(check_help_text),
             "validate the configuration, connect to both ends, check the role's privileges%s%s,"
             " print 'configuration OK'",
             brokers[0] != '\0' ? " and that " : "", brokers);
}

/* Lists the relay's options, then each group of the sink registry; returns how many. */
static size_t
all_options(struct option_entry *entries)
{
    const struct option_spec *rows;
    const char *title;
    size_t n = 0, count;

    check_help();
    for (size_t i = 0; i < OPTION_COUNT; i++)
        entries[n++] = (struct option_entry){&OPTIONS[i], 0, NULL};
    for (size_t g = 0; (rows = sink_option_group(g, &title, &count)) != NULL; g++)
        for (size_t i = 0; i < count && n < ENTRIES_MAX; i++)
            entries[n++] = (struct option_entry){&rows[i], g, title};
    return n;
}

/* The field entry fills in config; NULL while the broker's configuration is not allocated. */
static char *
field_of(struct relay_config *config, const struct option_entry *entry)
{
    char *target = entry->group == NULL
                       ? (char *)config
                       : sink_option_group_target(&config->broker, entry->sink_group);

    return target != NULL ? target + entry->spec->offset : NULL;
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
clear_value(struct relay_config *config, const struct option_entry *entry)
{
    const struct option_spec *spec = entry->spec;
    char *base = field_of(config, entry);

    if (base == NULL)
        return;
    if (spec->kind == OPTION_STRING) {
        free(*(char **)base);
        *(char **)base = NULL;
    } else if (spec->kind == OPTION_LIST) {
        char **list = *(char ***)base;

        for (size_t i = 0; list != NULL && list[i] != NULL; i++)
            free(list[i]);
        free(list);
        *(char ***)base = NULL;
        config->queue_count = 0;
    }
}

/* A queue name as the schema allows it: 1 to QUEUE_NAME_MAX of [A-Za-z0-9._:-]. */
static bool
queue_name_valid(const char *name, size_t len)
{
    if (len == 0 || len > QUEUE_NAME_MAX)
        return false;
    for (size_t i = 0; i < len; i++) {
        char c = name[i];

        if (!isalnum((unsigned char)c) && c != '.' && c != '_' && c != ':' && c != '-')
            return false;
    }
    return true;
}

/*
 * One setter per option kind. Each reads text into the field at base;
 * `source` names the option in errors ("--lease" or "OUTBOX_LEASE").
 */

static int
set_string(struct relay_config *config, const struct option_entry *entry, char *base,
           const char *text, const char *source, struct outbox_error *err)
{
    size_t max_length = entry->spec->max_length;
    char *copy;

    /* a row's max_length, e.g. a protocol's short string: a broker closes the connection on more */
    if (max_length > 0 && strlen(text) > max_length)
        return outbox_error_set(err, OUTBOX_ERR_CONFIG, "%s: longer than %zu bytes (%zu)", source,
                                max_length, strlen(text));
    copy = strdup(text);
    if (copy == NULL)
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    clear_value(config, entry);
    *(char **)base = copy;
    return 0;
}

/* A comma-separated list of queue names (--queues). */
static int
set_list(struct relay_config *config, const struct option_entry *entry, char *base,
         const char *text, const char *source, struct outbox_error *err)
{
    char quoted[OPTION_QUOTE_MAX + 1];
    size_t count = 0, i = 0;
    const char *p = text;
    char **list;

    clear_value(config, entry);
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
                             "%s: invalid queue name '%s' (1-%d characters of"
                             " A-Z a-z 0-9 . _ : -)",
                             source, option_quote(name, quoted), QUEUE_NAME_MAX);
            free(name);
            return -1;
        }
        list[i] = strndup(p, len);
        if (list[i] == NULL)
            return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
        config->queue_count = ++i;
        if (p[len] == '\0')
            return 0;
        p += len + 1;
    }
}

/* Sets one option from text, by its kind. */
static int
set_value(struct relay_config *config, const struct option_entry *entry, const char *text,
          const char *source, struct outbox_error *err)
{
    const struct option_spec *spec = entry->spec;
    char *base = field_of(config, entry);

    if (base == NULL)
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "broker options not allocated");
    switch (spec->kind) {
    case OPTION_STRING:
        return set_string(config, entry, base, text, source, err);
    case OPTION_LIST:
        return set_list(config, entry, base, text, source, err);
    case OPTION_INT:
    case OPTION_INT64:
        return option_set_number(spec, base, text, source, err);
    case OPTION_SECONDS:
    case OPTION_MILLIS:
        return option_set_duration(spec, base, text, source, err);
    case OPTION_FLAG:
        return option_set_flag(base, text, source, err);
    case OPTION_CHOICE:
        return option_set_choice(spec, base, text, source, err);
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
    char quoted[OPTION_QUOTE_MAX + 1];
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
                                " '%s': %s", option_quote(path, quoted), strerror(saved_errno));
    }
    len = fread(text, 1, PASSWORD_FILE_MAX + 1, file);
    saved_errno = ferror(file) ? errno : 0;
    fclose(file);
    if (saved_errno != 0 || len > PASSWORD_FILE_MAX) {
        free(text);
        return outbox_error_set(err, OUTBOX_ERR_CONFIG, "--broker-password-file: unable to read"
                                " '%s': %s", option_quote(path, quoted),
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
                                "--broker-password-file: '%s' %s", option_quote(path, quoted),
                                len == 0 ? "is empty" : "holds more than one line");
    }
    *password = text;
    return 0;
}

/* Index of the option called [name, name+len) in entries, or -1. */
static int
find_option(const struct option_entry *entries, size_t count, const char *name, size_t len)
{
    for (size_t i = 0; i < count; i++)
        if (strlen(entries[i].spec->name) == len && strncmp(entries[i].spec->name, name, len) == 0)
            return (int)i;
    return -1;
}

/*
 * Reads argv into given[] (per entry, the last value the command line
 * gave, or NULL), without setting anything: the variables of options the
 * command line gives are then never read.
 */
static int
read_command_line(const struct option_entry *entries, size_t count, int argc,
                  const char *const *argv, const char **given, struct outbox_error *err)
{
    char quoted[OPTION_QUOTE_MAX + 1];

    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i], *name, *value = NULL;
        size_t len;
        int index;

        if (strncmp(arg, "--", 2) != 0 || arg[2] == '\0')
            return outbox_error_set(err, OUTBOX_ERR_CONFIG,
                                    "unexpected argument '%s' (options start with --; see --help)",
                                    option_quote(arg, quoted));
        name = arg + 2;
        len = strcspn(name, "=");
        if (name[len] == '=')
            value = name + len + 1;
        index = find_option(entries, count, name, len);
        if (index < 0) {
            char *unknown = strndup(name, len);

            if (unknown == NULL)
                return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
            outbox_error_set(err, OUTBOX_ERR_CONFIG, "unknown option '--%s' (see --help)",
                             option_quote(unknown, quoted));
            free(unknown);
            return -1;
        }
        if (entries[index].spec->kind == OPTION_FLAG) {
            if (value == NULL)
                value = "true";
        } else if (value == NULL) {
            if (i + 1 >= argc)
                return outbox_error_set(err, OUTBOX_ERR_CONFIG, "--%s needs a value (%s)",
                                        entries[index].spec->name, entries[index].spec->metavar);
            value = argv[++i];
        }
        given[index] = value;
    }
    return 0;
}

/* Defaults, then the environment, then the command line's given[] values. */
static int
set_values(struct relay_config *config, const struct option_entry *entries, size_t count,
           const char *const *given, bool *provided, struct outbox_error *err)
{
    char source[64];

    for (size_t i = 0; i < count; i++)
        if (entries[i].spec->fallback != NULL &&
            set_value(config, &entries[i], entries[i].spec->fallback, entries[i].spec->name, err) != 0)
            return -1;
    for (size_t i = 0; i < count; i++) {
        const char *value;

        if (given[i] != NULL || !entries[i].spec->from_environment)
            continue;
        env_name(entries[i].spec, source, sizeof(source));
        value = getenv(source);
        if (value != NULL && set_value(config, &entries[i], value, source, err) != 0)
            return -1;
        provided[i] = value != NULL;
    }
    for (size_t i = 0; i < count; i++) {
        if (given[i] == NULL)
            continue;
        snprintf(source, sizeof(source), "--%s", entries[i].spec->name);
        if (set_value(config, &entries[i], given[i], source, err) != 0)
            return -1;
        provided[i] = true;
    }
    return 0;
}

/*
 * Options that belong to a broker other than --broker's do nothing. Given
 * on the command line, one is a mistake (a copied option, a mistyped
 * --broker): a configuration error. From the environment (a file shared by
 * relays of several brokers) they are listed in config->ignored_options,
 * and the relay says so once at start.
 */
static int
note_other_broker_options(struct relay_config *config, const struct option_entry *entries,
                          size_t count, const char *const *given, const bool *provided,
                          struct outbox_error *err)
{
    const char *kind = sink_kind_of_url(config->broker.url);
    size_t used = 0;

    config->ignored_options[0] = '\0';
    for (size_t i = 0; i < count && kind != NULL; i++) {
        if (!provided[i] || entries[i].group == NULL || strcmp(entries[i].group, "broker") == 0 ||
            strcmp(entries[i].group, kind) == 0)
            continue;
        if (given[i] != NULL)
            return outbox_error_set(err, OUTBOX_ERR_CONFIG,
                                    "--%s is an option of %s, not of the %s broker --broker names",
                                    entries[i].spec->name, entries[i].group, kind);
        used += (size_t)snprintf(config->ignored_options + used,
                                 used < sizeof(config->ignored_options)
                                     ? sizeof(config->ignored_options) - used
                                     : 0,
                                 "%s--%s", used > 0 ? " " : "", entries[i].spec->name);
        if (used >= sizeof(config->ignored_options))
            break;
    }
    return 0;
}

/* --databases: the list readable and well formed, and what the mode does not offer. */
static int
check_databases_mode(const struct relay_config *config, struct outbox_error *err)
{
    struct database_list list;

    if (config->once || config->check)
        return outbox_error_set(err, OUTBOX_ERR_CONFIG, "--databases: %s is not available with a"
                                " list of databases", config->once ? "--once" : "--check");
    if (database_list_read(config->databases_file, &list, err) != 0)
        return -1;
    database_list_clear(&list);
    return 0;
}

/*
 * --cloudevents-source: a URI-reference (RFC 3986) as CloudEvents wants it:
 * not empty, printable ASCII without spaces, quotes, angle brackets or
 * backslashes.
 */
static int
check_cloudevents_source(const char *source, struct outbox_error *err)
{
    char quoted[OPTION_QUOTE_MAX + 1];

    if (source == NULL)
        return 0;
    if (source[0] == '\0')
        return outbox_error_set(err, OUTBOX_ERR_CONFIG, "--cloudevents-source: must not be empty");
    for (const unsigned char *c = (const unsigned char *)source; *c != '\0'; c++)
        if (*c <= ' ' || *c >= 0x7f || strchr("\"<>\\^`{|}", *c) != NULL)
            return outbox_error_set(err, OUTBOX_ERR_CONFIG,
                                    "--cloudevents-source: '%s' is not a URI reference",
                                    option_quote(source, quoted));
    return 0;
}

/* The broker's URL and options, and options that go together. */
static int
check_broker(const struct relay_config *config, struct outbox_error *err)
{
    struct outbox_error inner;
    struct broker_url url;
    sink *broker;

    if (config->broker.url == NULL || config->broker.url[0] == '\0')
        return outbox_error_set(err, OUTBOX_ERR_CONFIG, "--broker is required (or OUTBOX_BROKER)");
    if (sink_url_parse(config->broker.url, &url, &inner) != 0)
        return outbox_error_set(err, OUTBOX_ERR_CONFIG, "--broker: %s", inner.message);
    url_clear(&url);
    /* the broker's own checks of its options (no I/O); their messages name the option */
    broker = sink_new(&config->broker, &inner);
    if (broker == NULL)
        return outbox_error_set(err, inner.code, "%s", inner.message);
    sink_free(broker);
    if (config->retry_max_seconds < config->retry_base_seconds)
        return outbox_error_set(err, OUTBOX_ERR_CONFIG,
                                "--retry-max must not be below --retry-base");
    if (config->once && config->check)
        return outbox_error_set(err, OUTBOX_ERR_CONFIG, "--once and --check exclude each other");
    return check_cloudevents_source(config->cloudevents_source, err);
}

/* What no single option can check: required ones, URLs, and options that go together. */
static int
check_values(const struct relay_config *config, struct outbox_error *err)
{
    struct outbox_error inner;

    if (config->databases_file != NULL && config->database_url != NULL)
        return outbox_error_set(err, OUTBOX_ERR_CONFIG,
                                "--databases and --database-url exclude each other");
    if (config->databases_file != NULL)
        return check_databases_mode(config, err) != 0 ? -1 : check_broker(config, err);
    if (config->database_url == NULL || config->database_url[0] == '\0')
        return outbox_error_set(err, OUTBOX_ERR_CONFIG,
                                "--database-url is required (or OUTBOX_DATABASE_URL)");
    if (config->broker.url == NULL || config->broker.url[0] == '\0')
        return outbox_error_set(err, OUTBOX_ERR_CONFIG, "--broker is required (or OUTBOX_BROKER)");
    if (url_check_database(config->database_url, &inner) != 0)
        return outbox_error_set(err, OUTBOX_ERR_CONFIG, "--database-url: %s", inner.message);
    return check_broker(config, err);
}

int
config_parse(struct relay_config *config, int argc, const char *const *argv,
             struct outbox_error *err)
{
    struct option_entry entries[ENTRIES_MAX];
    size_t count = all_options(entries);
    const char *given[ENTRIES_MAX] = {NULL};
    bool provided[ENTRIES_MAX] = {false};

    memset(config, 0, sizeof(*config));
    if (sink_options_init(&config->broker, err) != 0)
        return -1;
    if (read_command_line(entries, count, argc, argv, given, err) != 0 ||
        set_values(config, entries, count, given, provided, err) != 0)
        goto fail;
    /* these need no database or broker: a health check asks a running relay */
    if (config->help || config->version || config->healthcheck)
        return 0;
    if (config->broker.password_file != NULL &&
        read_password_file(config->broker.password_file, (char **)&config->broker.password, err) != 0)
        goto fail;
    if (check_values(config, err) != 0 ||
        note_other_broker_options(config, entries, count, given, provided, err) != 0)
        goto fail;
    return 0;

fail:
    config_clear(config);
    return -1;
}

void
config_clear(struct relay_config *config)
{
    struct option_entry entries[ENTRIES_MAX];
    size_t count = all_options(entries);

    if (config == NULL)
        return;
    if (config->broker.password != NULL) {
        char *password = (char *)config->broker.password;

        memset(password, 0, strlen(password));
        free(password);
    }
    for (size_t i = 0; i < count; i++)
        clear_value(config, &entries[i]);
    sink_options_clear(&config->broker);
    memset(config, 0, sizeof(*config));
}

/* One --help line per option, default in brackets; after a long name the text starts a line. */
static void
usage_line(FILE *out, const struct option_spec *spec)
{
    char left[64];

    snprintf(left, sizeof(left), "--%s%s%s", spec->name, spec->metavar ? " " : "",
             spec->metavar ? spec->metavar : "");
    if (strlen(left) > USAGE_NAME_WIDTH)
        fprintf(out, "  %s\n%*s%s", left, USAGE_NAME_WIDTH + 3, "", spec->help);
    else
        fprintf(out, "  %-*s %s", USAGE_NAME_WIDTH, left, spec->help);
    if (spec->fallback != NULL && spec->fallback[0] != '\0' && spec->kind != OPTION_FLAG)
        fprintf(out, " [%s]", spec->fallback);
    fputc('\n', out);
}

void
config_usage(FILE *out)
{
    struct option_entry entries[ENTRIES_MAX];
    size_t count = all_options(entries), only = 0, shown = 0;
    const char *group = NULL;

    fprintf(out,
            "usage: outbox-relay --database-url URL --broker URL [options]\n"
            "       outbox-relay --databases FILE --broker URL [options]\n"
            "\n"
            "Publishes committed rows of outbox.job to %s.\n"
            "Every option that takes a value can also be set as OUTBOX_<NAME> in the\n"
            "environment (--batch-size as OUTBOX_BATCH_SIZE); the command line wins and\n"
            "its variable is then not read.",
            sink_products());
    for (size_t i = 0; i < count; i++)
        only += !entries[i].spec->from_environment;
    for (size_t i = 0; i < count; i++) {
        if (entries[i].spec->from_environment)
            continue;
        shown++;
        fprintf(out, "%s--%s", shown == 1 ? (only > 1 ? " " : " Only ") :
                               shown == only ? " and " : ", ", entries[i].spec->name);
    }
    if (only > 0)
        fputs(only > 1 ? " are read\nfrom the command line only." : " is read from the command line only.", out);
    fputs("\n\noptions:\n", out);
    for (size_t i = 0; i < count; i++) {
        if (entries[i].group != NULL && (group == NULL || strcmp(group, entries[i].group) != 0)) {
            group = entries[i].group;
            fprintf(out, "\n%s options:\n", group);
        }
        usage_line(out, entries[i].spec);
    }
    fputs("\nsignals: the first SIGTERM, SIGINT or SIGHUP stops claiming and lets the batch in\n"
          "flight finish (SIGHUP does not reload: restart to apply a new configuration);\n"
          "a second one exits at once.\n",
          out);
    fputs("\nexit status: 0 clean stop, 1 runtime error, 2 usage or configuration error\n", out);
}

sink *
config_sink_new(const struct relay_config *config, struct outbox_error *err)
{
    struct sink_options options = config->broker;
    sink *s;

    options.connect_timeout_ms = config->broker_connect_timeout_ms;
    options.io_timeout_ms = config->broker_io_timeout_ms;
    s = sink_new(&options, err);
    if (s != NULL)
        sink_set_redelivery_horizon(
            s, (int64_t)((config->lease_seconds + config->retry_max_seconds) * 1000.0));
    return s;
}
