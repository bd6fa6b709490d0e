/*
 * sink_registry.c - the registry of brokers: SINK_TYPES below is the one
 * list of them, and nothing else in the relay names one. From it come the
 * option groups (--help, parsing), each broker's configuration block, the
 * URL schemes a --broker may use, and sink_new(), which picks the broker of
 * a URL's scheme once.
 *
 * The registry never reads a broker's own options: it allocates and frees
 * each module's configuration block, whose rows the option parser fills,
 * and hands the block to the broker's init.
 */
#include "sink_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "error.h"
#include "redact.h"
#include "timeouts.h"

/* ---- the registry: one row per broker ------------------------------------ */

extern const struct sink_type sink_amqp_type;
extern const struct sink_type sink_redis_type;
extern const struct sink_type sink_nats_type;
extern const struct sink_type sink_kafka_type;

static const struct sink_type *const SINK_TYPES[] = {
    &sink_amqp_type,
    &sink_redis_type,
    &sink_nats_type,
    &sink_kafka_type,
};

#define SINK_TYPE_COUNT (sizeof(SINK_TYPES) / sizeof(SINK_TYPES[0]))

_Static_assert(SINK_TYPE_COUNT <= SINK_BROKER_MAX, "raise SINK_BROKER_MAX");

/* --broker's help: each scheme's usage, from the registry (see broker_help). */
static char broker_help_text[1024];

/* Options every broker reads. */
static struct option_spec COMMON_OPTIONS[] = {
    {"broker", "URL", OPTION_STRING, OPTION_FIELD(struct sink_options, url), NULL, 0, 0, NULL,
     broker_help_text, OPTION_FROM_ENVIRONMENT, 0},
    {"broker-password-file", "PATH", OPTION_STRING, OPTION_FIELD(struct sink_options, password_file),
     NULL, 0, 0, NULL,
     "the broker password, read from this file (out of the process list); overrides one in"
     " --broker", OPTION_FROM_ENVIRONMENT, 0},
    {"max-message-bytes", "N", OPTION_INT64, OPTION_FIELD(struct sink_options, max_message_bytes),
     "134217728", 1, 2147483647, NULL,
     "larger payloads fail at once as dead rows (RabbitMQ's default limit is 128 MiB)",
     OPTION_FROM_ENVIRONMENT, 0},
};

/* Writes "A, B or C; required" from every scheme's usage into broker_help_text, once. */
static void
broker_help(void)
{
    size_t total = 0, seen = 0, used = 0;

    if (broker_help_text[0] != '\0')
        return;
    for (size_t t = 0; t < SINK_TYPE_COUNT; t++)
        for (const struct url_scheme *const *p = SINK_TYPES[t]->schemes; *p != NULL; p++)
            total++;
    for (size_t t = 0; t < SINK_TYPE_COUNT; t++)
        for (const struct url_scheme *const *p = SINK_TYPES[t]->schemes; *p != NULL; p++) {
            seen++;
            used += (size_t)snprintf(broker_help_text + used, sizeof(broker_help_text) - used,
                                     "%s%s", seen == 1 ? "" : seen == total ? " or " : ", ",
                                     (*p)->usage);
            if (used >= sizeof(broker_help_text))
                return; /* truncated: the registry outgrew the buffer */
        }
    snprintf(broker_help_text + used, sizeof(broker_help_text) - used, "; required");
}

/* Joins each broker's text (products, else check_help) into out, once: "A, B or C". */
static const char *
join_types(char *out, size_t size, bool products)
{
    size_t total = 0, seen = 0, used = 0;

    if (out[0] != '\0')
        return out;
    for (size_t t = 0; t < SINK_TYPE_COUNT; t++)
        total += (products ? SINK_TYPES[t]->product : SINK_TYPES[t]->check_help) != NULL;
    for (size_t t = 0; t < SINK_TYPE_COUNT && used < size; t++) {
        const char *text = products ? SINK_TYPES[t]->product : SINK_TYPES[t]->check_help;

        if (text == NULL)
            continue;
        seen++;
        used += (size_t)snprintf(out + used, size - used, "%s%s",
                                 seen == 1          ? ""
                                 : !products        ? " and "
                                 : seen == total    ? " or "
                                                    : ", ",
                                 text);
    }
    return out;
}

const char *
sink_products(void)
{
    static char text[256];

    return join_types(text, sizeof(text), true);
}

const char *
sink_check_help(void)
{
    static char text[256];

    return join_types(text, sizeof(text), false);
}

const struct option_spec *
sink_option_group(size_t index, const char **title, size_t *count)
{
    broker_help();
    if (index == 0) {
        *title = "broker";
        *count = sizeof(COMMON_OPTIONS) / sizeof(COMMON_OPTIONS[0]);
        return COMMON_OPTIONS;
    }
    if (index > SINK_TYPE_COUNT)
        return NULL;
    *title = SINK_TYPES[index - 1]->kind;
    *count = SINK_TYPES[index - 1]->option_count;
    return SINK_TYPES[index - 1]->options;
}

void *
sink_option_group_target(struct sink_options *options, size_t index)
{
    if (index == 0)
        return options;
    return index <= SINK_TYPE_COUNT ? options->broker_config[index - 1] : NULL;
}

/* A fresh configuration of type: zeroed, then its defaults; NULL when out of memory. */
static void *
config_new(const struct sink_type *type)
{
    void *config = calloc(1, type->config_size > 0 ? type->config_size : 1);

    if (config != NULL && type->config_defaults != NULL)
        type->config_defaults(config);
    return config;
}

/* Frees config of type (NULL: nothing): the strings its rows filled, config_free's, the block. */
static void
config_destroy(const struct sink_type *type, void *config)
{
    if (config == NULL)
        return;
    for (size_t i = 0; i < type->option_count; i++)
        if (type->options[i].kind == OPTION_STRING) {
            char **field = (char **)((char *)config + type->options[i].offset);

            free(*field);
            *field = NULL;
        }
    if (type->config_free != NULL)
        type->config_free(config);
    free(config);
}

int
sink_options_init(struct sink_options *options, struct outbox_error *err)
{
    for (size_t t = 0; t < SINK_TYPE_COUNT; t++) {
        if (options->broker_config[t] != NULL)
            continue;
        options->broker_config[t] = config_new(SINK_TYPES[t]);
        if (options->broker_config[t] == NULL) {
            sink_options_clear(options);
            return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
        }
    }
    return 0;
}

void
sink_options_clear(struct sink_options *options)
{
    for (size_t t = 0; t < SINK_TYPE_COUNT; t++) {
        config_destroy(SINK_TYPES[t], options->broker_config[t]);
        options->broker_config[t] = NULL;
    }
}

void **
sink_options_broker(struct sink_options *options, const char *kind)
{
    for (size_t t = 0; t < SINK_TYPE_COUNT; t++)
        if (strcmp(SINK_TYPES[t]->kind, kind) == 0)
            return &options->broker_config[t];
    return NULL;
}

/* Every scheme of every broker, and their names for errors ("amqp, amqps or redis"). */
static size_t
all_schemes(const struct url_scheme **schemes, size_t capacity, char *names, size_t names_size)
{
    size_t count = 0, used = 0;

    for (size_t t = 0; t < SINK_TYPE_COUNT; t++)
        for (const struct url_scheme *const *p = SINK_TYPES[t]->schemes; *p != NULL; p++)
            if (count < capacity)
                schemes[count++] = *p;
    names[0] = '\0';
    for (size_t i = 0; i < count && used < names_size; i++)
        used += (size_t)snprintf(names + used, names_size - used, "%s%s://",
                                 i == 0 ? "" : i + 1 == count ? " or " : ", ", schemes[i]->name);
    return count;
}

#define SCHEMES_MAX 32

/* The schemes whose userinfo is a token, for the library's redaction (register_token_schemes). */
static const char *token_schemes[SCHEMES_MAX + 1];

/*
 * Tells url_redact which schemes of the registry carry a token as their
 * userinfo (NATS), before main() runs: no URL of the relay, nor any text
 * quoting one, is redacted before it, whoever redacts it first.
 */
__attribute__((constructor)) static void
register_token_schemes(void)
{
    size_t n = 0;

    for (size_t t = 0; t < SINK_TYPE_COUNT; t++)
        for (const struct url_scheme *const *p = SINK_TYPES[t]->schemes; *p != NULL; p++)
            if ((*p)->userinfo_token && n < SCHEMES_MAX)
                token_schemes[n++] = (*p)->name;
    url_redact_token_schemes(token_schemes);
}

int
sink_url_parse(const char *text, struct broker_url *url, struct outbox_error *err)
{
    const struct url_scheme *schemes[SCHEMES_MAX];
    char names[512];
    size_t count = all_schemes(schemes, SCHEMES_MAX, names, sizeof(names));

    return url_parse(text, schemes, count, names, url, err);
}

/*
 * The broker speaking scheme (sink_url_parse only yields known ones), and
 * its row in the registry: the slot of its options.broker_config.
 */
static const struct sink_type *
type_of_scheme(const struct url_scheme *scheme, size_t *index)
{
    *index = 0;
    for (size_t t = 0; t < SINK_TYPE_COUNT; t++)
        for (const struct url_scheme *const *p = SINK_TYPES[t]->schemes; *p != NULL; p++)
            if (*p == scheme) {
                *index = t;
                return SINK_TYPES[t];
            }
    return SINK_TYPES[0];
}

const char *
sink_kind_of_url(const char *url)
{
    size_t len = url != NULL ? strcspn(url, ":") : 0;

    if (url == NULL || strncmp(url + len, "://", 3) != 0)
        return NULL;
    for (size_t t = 0; t < SINK_TYPE_COUNT; t++)
        for (const struct url_scheme *const *p = SINK_TYPES[t]->schemes; *p != NULL; p++)
            if (strlen((*p)->name) == len && strncmp(url, (*p)->name, len) == 0)
                return SINK_TYPES[t]->kind;
    return NULL;
}

/* ---- a sink of the URL's broker ------------------------------------------- */

/* A random endpoint index below count, so that relays spread over a cluster's nodes. */
static size_t
random_endpoint(size_t count)
{
    unsigned int value;

    if (count <= 1)
        return 0;
    if (getrandom(&value, sizeof(value), GRND_NONBLOCK) != (ssize_t)sizeof(value))
        value = (unsigned int)getpid() ^ (unsigned int)time(NULL) ^ (unsigned int)clock();
    return value % count;
}

/* Puts a copy of password in url, in place of (and wiping) the URL's own. */
static int
replace_password(struct broker_url *url, const char *password, struct outbox_error *err)
{
    char *copy = strdup(password);

    if (copy == NULL)
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    if (url->password != NULL) {
        memset(url->password, 0, strlen(url->password));
        free(url->password);
    }
    url->password = copy;
    return 0;
}

sink *
sink_new(const struct sink_options *options, struct outbox_error *err)
{
    sink *s = calloc(1, sizeof(*s));
    void *defaults = NULL;
    size_t type;

    if (s == NULL) {
        outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
        return NULL;
    }
    s->options = *options;
    s->options.url = strdup(options->url != NULL ? options->url : "");
    s->display_url = url_redact(options->url);
    memset(s->options.broker_config, 0, sizeof(s->options.broker_config)); /* not kept */
    if (s->options.url == NULL || s->display_url == NULL) {
        outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
        goto fail;
    }
    if (s->options.connect_timeout_ms <= 0)
        s->options.connect_timeout_ms = TIMEOUT_BROKER_CONNECT_MS;
    if (s->options.io_timeout_ms <= 0)
        s->options.io_timeout_ms = TIMEOUT_BROKER_IO_MS;
    if (s->options.max_message_bytes == 0)
        s->options.max_message_bytes = SINK_DEFAULT_MAX_MESSAGE_BYTES;
    s->options.password = NULL; /* copied into s->url below, not kept */
    s->options.password_file = NULL;
    if (sink_url_parse(options->url, &s->url, err) != 0)
        goto fail;
    if (options->password != NULL && replace_password(&s->url, options->password, err) != 0)
        goto fail;
    s->type = type_of_scheme(s->url.scheme, &type);
    s->ops = s->type->ops;
    for (size_t i = 0; i < s->url.endpoint_count; i++)
        url_endpoint_format(&s->url.endpoints[i], s->endpoint_names[i],
                            sizeof(s->endpoint_names[i]));
    s->endpoint = s->ops->endpoint_alternatives ? random_endpoint(s->url.endpoint_count) : 0;
    /* a caller that set none of this broker's options gets its defaults */
    if (options->broker_config[type] == NULL && (defaults = config_new(s->type)) == NULL) {
        outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
        goto fail;
    }
    if (s->ops->init(s, defaults != NULL ? defaults : options->broker_config[type], err) != 0)
        goto fail;
    config_destroy(s->type, defaults);
    return s;

fail:
    if (s->type != NULL)
        config_destroy(s->type, defaults);
    sink_free(s);
    return NULL;
}
