/*
 * log.c - text and JSON event lines, written atomically, with rate limiting.
 */
#include "log.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "buffer.h"
#include "error.h"
#include "json.h"

#define RATE_KEY_MAX 64
#define RATE_SLOTS 128
/* Room for a field of one number as text: " suppressed=" and a 64-bit count, with its NUL. */
#define LOG_NUMBER_TEXT_MAX 48

/* One rate-limited key: when it was last logged and how often it was dropped since. */
struct rate_slot {
    char key[RATE_KEY_MAX];
    int64_t last_ms;
    uint64_t suppressed;
    bool used;
};

/* One parsed field: pointers into the formatted fields string. */
struct field {
    const char *key;
    size_t key_len;
    const char *value;
    size_t value_len;
    bool quoted;
};

static int64_t real_now_ms(void);

/* lock guards everything below except min_level, which is read without it. */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_int min_level = OUTBOX_LOG_INFO;
static enum log_format format = OUTBOX_LOG_TEXT;
static FILE *out_stream = NULL; /* NULL = stderr */
static int64_t (*clock_ms)(void) = real_now_ms;
static int64_t rate_interval_ms = LOG_RATE_LIMIT_DEFAULT_MS;
static struct rate_slot rate_slots[RATE_SLOTS];

static int64_t
real_now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Appends a \xNN escape, used for control bytes in text output. */
static void
line_put_hex_escape(struct buffer *l, unsigned char c, const char *prefix)
{
    static const char hex[] = "0123456789abcdef";

    buffer_puts(l, prefix);
    buffer_putc(l, hex[c >> 4]);
    buffer_putc(l, hex[c & 0xf]);
}

static bool
is_key_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '.' || c == '-' || c == ':';
}

/*
 * True when s (just after a closing quote candidate) is the end of the
 * fields or spaces followed by another "key=": that quote ends the value.
 */
static bool
quote_ends_value(const char *s)
{
    const char *k;

    if (*s == '\0')
        return true;
    if (*s != ' ')
        return false;
    while (*s == ' ')
        s++;
    if (*s == '\0')
        return true;
    for (k = s; is_key_char(*k); k++)
        ;
    return k > s && *k == '=';
}

/*
 * Splits formatted fields into at most max fields. A token without '='
 * turns the rest of the string into one quoted field named "extra", so
 * nothing the caller wrote is lost.
 */
static size_t
parse_fields(const char *s, struct field *fields, size_t max)
{
    size_t n = 0;

    while (s != NULL && n < max) {
        struct field *f = &fields[n];
        const char *p;

        while (*s == ' ')
            s++;
        if (*s == '\0')
            break;
        for (p = s; is_key_char(*p); p++)
            ;
        if (p == s || *p != '=') {
            *f = (struct field){"extra", 5, s, strlen(s), true};
            n++;
            break;
        }
        f->key = s;
        f->key_len = (size_t)(p - s);
        p++;
        if (*p == '"') {
            const char *q;

            f->value = ++p;
            f->quoted = true;
            for (q = p; *q != '\0'; q++)
                if (*q == '"' && quote_ends_value(q + 1))
                    break;
            f->value_len = (size_t)(q - p);
            s = *q == '"' ? q + 1 : q;
        } else {
            f->value = p;
            f->quoted = false;
            f->value_len = strcspn(p, " ");
            s = p + f->value_len;
        }
        n++;
    }
    return n;
}

/* Text output: does this value need quotes to stay one unambiguous token? */
static bool
text_needs_quotes(const char *v, size_t n)
{
    if (n == 0)
        return true;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)v[i];

        if (c <= ' ' || c == '"' || c == '=' || c == '\\' || c == 0x7f)
            return true;
    }
    return false;
}

/* Text output: appends v, escaping control bytes (and quotes/backslashes when quoted). */
static void
text_put_escaped(struct buffer *l, const char *v, size_t n, bool quoted)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)v[i];

        if (c == '\n')
            buffer_puts(l, "\\n");
        else if (c == '\t')
            buffer_puts(l, "\\t");
        else if (c == '\r')
            buffer_puts(l, "\\r");
        else if (c < 0x20 || c == 0x7f)
            line_put_hex_escape(l, c, "\\x");
        else if (quoted && (c == '"' || c == '\\')) {
            buffer_putc(l, '\\');
            buffer_putc(l, (char)c);
        } else
            buffer_putc(l, (char)c);
    }
}

/* True when v is a JSON number as written (no leading zeros, optional fraction/exponent). */
static bool
is_json_number(const char *v, size_t n)
{
    size_t i = 0;

    if (i < n && v[i] == '-')
        i++;
    if (i >= n)
        return false;
    if (v[i] == '0')
        i++;
    else if (v[i] >= '1' && v[i] <= '9')
        while (i < n && v[i] >= '0' && v[i] <= '9')
            i++;
    else
        return false;
    if (i < n && v[i] == '.') {
        size_t start = ++i;

        while (i < n && v[i] >= '0' && v[i] <= '9')
            i++;
        if (i == start)
            return false;
    }
    if (i < n && (v[i] == 'e' || v[i] == 'E')) {
        size_t start;

        i++;
        if (i < n && (v[i] == '+' || v[i] == '-'))
            i++;
        start = i;
        while (i < n && v[i] >= '0' && v[i] <= '9')
            i++;
        if (i == start)
            return false;
    }
    return i == n;
}

static void
format_timestamp(int64_t ms, char *buf, size_t size)
{
    time_t secs = (time_t)(ms / 1000);
    int millis = (int)(ms % 1000);
    struct tm tm;

    if (millis < 0) {
        millis += 1000;
        secs -= 1;
    }
    gmtime_r(&secs, &tm);
    snprintf(buf, size, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1,
             tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, millis);
}

static void
render_text(struct buffer *l, const char *ts, enum log_level level, const char *msg,
            const struct field *fields, size_t nfields, uint64_t suppressed)
{
    char level_column[8];
    char number[LOG_NUMBER_TEXT_MAX];

    snprintf(level_column, sizeof(level_column), "%-5s", log_level_name(level));
    buffer_puts(l, ts);
    buffer_putc(l, ' ');
    buffer_puts(l, level_column);
    buffer_putc(l, ' ');
    text_put_escaped(l, msg, strlen(msg), false);
    for (size_t i = 0; i < nfields; i++) {
        const struct field *f = &fields[i];
        bool quote = f->quoted || text_needs_quotes(f->value, f->value_len);

        buffer_putc(l, ' ');
        buffer_append(l, f->key, f->key_len);
        buffer_putc(l, '=');
        if (quote)
            buffer_putc(l, '"');
        text_put_escaped(l, f->value, f->value_len, quote);
        if (quote)
            buffer_putc(l, '"');
    }
    if (suppressed > 0) {
        snprintf(number, sizeof(number), " suppressed=%llu", (unsigned long long)suppressed);
        buffer_puts(l, number);
    }
    buffer_putc(l, '\n');
}

static void
render_json(struct buffer *l, const char *ts, enum log_level level, const char *msg,
            const struct field *fields, size_t nfields, uint64_t suppressed)
{
    char number[LOG_NUMBER_TEXT_MAX];

    buffer_puts(l, "{\"ts\":\"");
    buffer_puts(l, ts);
    buffer_puts(l, "\",\"level\":\"");
    buffer_puts(l, log_level_name(level));
    buffer_puts(l, "\",\"msg\":");
    json_put_string(l, msg, strlen(msg), 0);
    for (size_t i = 0; i < nfields; i++) {
        const struct field *f = &fields[i];

        buffer_putc(l, ',');
        json_put_string(l, f->key, f->key_len, 0);
        buffer_putc(l, ':');
        if (!f->quoted && (is_json_number(f->value, f->value_len) ||
                           (f->value_len == 4 && memcmp(f->value, "true", 4) == 0) ||
                           (f->value_len == 5 && memcmp(f->value, "false", 5) == 0)))
            buffer_append(l, f->value, f->value_len);
        else
            json_put_string(l, f->value, f->value_len, 0);
    }
    if (suppressed > 0) {
        snprintf(number, sizeof(number), ",\"suppressed\":%llu", (unsigned long long)suppressed);
        buffer_puts(l, number);
    }
    buffer_puts(l, "}\n");
}

/* Writes the whole line to the configured stream; caller holds lock. */
static void
write_line(const char *data, size_t len)
{
    FILE *out = out_stream ? out_stream : stderr;
    int fd = fileno(out);

    if (fd < 0) {
        /* A stream without a descriptor (e.g. open_memstream): one locked fwrite. */
        fwrite(data, 1, len, out);
        fflush(out);
        return;
    }
    while (len > 0) {
        ssize_t n = write(fd, data, len);

        if (n < 0) {
            if (errno == EINTR)
                continue;
            return; /* nowhere left to report a logging failure */
        }
        data += n;
        len -= (size_t)n;
    }
}

#define FIELDS_MAX 32

static void
log_emit(enum log_level level, const char *msg, const char *fields_text, uint64_t suppressed)
{
    struct field fields[FIELDS_MAX];
    size_t nfields = parse_fields(fields_text, fields, FIELDS_MAX);
    struct buffer l = {0};
    char ts[96];

    pthread_mutex_lock(&lock);
    format_timestamp(clock_ms(), ts, sizeof(ts));
    if (format == OUTBOX_LOG_JSON)
        render_json(&l, ts, level, msg ? msg : "", fields, nfields, suppressed);
    else
        render_text(&l, ts, level, msg ? msg : "", fields, nfields, suppressed);
    if (!l.failed)
        write_line(l.data, l.len);
    pthread_mutex_unlock(&lock);
    free(l.data);
}

/*
 * Decides whether a rate-limited event with key is logged now. Returns true
 * and sets *suppressed to the number of events dropped since the last one
 * logged, or false (and counts the drop).
 */
static bool
rate_allow(const char *key, uint64_t *suppressed)
{
    struct rate_slot *slot = NULL, *oldest = &rate_slots[0];
    int64_t now;
    bool allow;

    pthread_mutex_lock(&lock);
    now = clock_ms();
    for (size_t i = 0; i < RATE_SLOTS; i++) {
        struct rate_slot *s = &rate_slots[i];

        if (s->used && strncmp(s->key, key, RATE_KEY_MAX - 1) == 0) {
            slot = s;
            break;
        }
        if (!s->used || (oldest->used && s->last_ms < oldest->last_ms))
            oldest = s;
    }
    if (slot == NULL) {
        /* New key: take a free slot, else forget the least recently logged key. */
        slot = oldest;
        memset(slot, 0, sizeof(*slot));
        slot->used = true;
        snprintf(slot->key, sizeof(slot->key), "%s", key);
        slot->last_ms = now;
        *suppressed = 0;
        allow = true;
    } else if (now - slot->last_ms >= rate_interval_ms || now < slot->last_ms) {
        /* Interval passed (or the wall clock went back): log and report drops. */
        *suppressed = slot->suppressed;
        slot->suppressed = 0;
        slot->last_ms = now;
        allow = true;
    } else {
        slot->suppressed++;
        allow = false;
    }
    pthread_mutex_unlock(&lock);
    return allow;
}

static void
log_vevent(const char *key, enum log_level level, const char *msg, const char *fields_format,
           va_list ap)
{
    uint64_t suppressed = 0;
    char *fields_text = NULL;

    if (!log_enabled(level))
        return;
    if (key != NULL && !rate_allow(key, &suppressed))
        return;
    if (fields_format != NULL && vasprintf(&fields_text, fields_format, ap) < 0)
        fields_text = NULL;
    log_emit(level, msg, fields_text, suppressed);
    free(fields_text);
}

void
log_configure(enum log_level level, enum log_format fmt, FILE *out)
{
    pthread_mutex_lock(&lock);
    atomic_store(&min_level, (int)level);
    format = fmt;
    out_stream = out;
    pthread_mutex_unlock(&lock);
}

bool
log_enabled(enum log_level level)
{
    return (int)level >= atomic_load(&min_level);
}

void
log_event(enum log_level level, const char *msg, const char *fields_format, ...)
{
    va_list ap;

    va_start(ap, fields_format);
    log_vevent(NULL, level, msg, fields_format, ap);
    va_end(ap);
}

void
log_event_limited(const char *key, enum log_level level, const char *msg, const char *fields_format,
                  ...)
{
    va_list ap;

    va_start(ap, fields_format);
    log_vevent(key, level, msg, fields_format, ap);
    va_end(ap);
}

void
log_set_rate_limit(int64_t interval_ms)
{
    pthread_mutex_lock(&lock);
    rate_interval_ms = interval_ms > 0 ? interval_ms : LOG_RATE_LIMIT_DEFAULT_MS;
    pthread_mutex_unlock(&lock);
}

void
log_set_clock(int64_t (*now_ms)(void))
{
    pthread_mutex_lock(&lock);
    clock_ms = now_ms ? now_ms : real_now_ms;
    pthread_mutex_unlock(&lock);
}

const char *
log_level_name(enum log_level level)
{
    switch (level) {
    case OUTBOX_LOG_DEBUG:
        return "debug";
    case OUTBOX_LOG_INFO:
        return "info";
    case OUTBOX_LOG_WARN:
        return "warn";
    case OUTBOX_LOG_ERROR:
        return "error";
    }
    return "info";
}

int
log_level_parse(const char *text, enum log_level *level, struct outbox_error *err)
{
    static const enum log_level levels[] = {OUTBOX_LOG_DEBUG, OUTBOX_LOG_INFO, OUTBOX_LOG_WARN,
                                            OUTBOX_LOG_ERROR};

    for (size_t i = 0; text != NULL && i < sizeof(levels) / sizeof(levels[0]); i++) {
        if (strcmp(text, log_level_name(levels[i])) == 0) {
            *level = levels[i];
            return 0;
        }
    }
    return outbox_error_set(err, OUTBOX_ERR_CONFIG,
                            "invalid log level '%s': expected debug, info, warn or error",
                            text ? text : "");
}

int
log_format_parse(const char *text, enum log_format *fmt, struct outbox_error *err)
{
    if (text != NULL && strcmp(text, "text") == 0) {
        *fmt = OUTBOX_LOG_TEXT;
        return 0;
    }
    if (text != NULL && strcmp(text, "json") == 0) {
        *fmt = OUTBOX_LOG_JSON;
        return 0;
    }
    return outbox_error_set(err, OUTBOX_ERR_CONFIG,
                            "invalid log format '%s': expected text or json", text ? text : "");
}
