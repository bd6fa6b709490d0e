/*
 * redact.c - passwords out of URLs, libpq conninfo strings and the messages quoting them.
 */
#include "redact.h"

#include <ctype.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


int
url_hex_value(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

char *
url_percent_decode(const char *start, size_t len)
{
    char *out = malloc(len + 1);
    size_t n = 0;

    if (out == NULL)
        return NULL;
    for (size_t i = 0; i < len; i++) {
        if (start[i] == '%') {
            int hi, lo;

            if (i + 2 >= len) {
                free(out);
                return NULL;
            }
            hi = url_hex_value(start[i + 1]);
            lo = url_hex_value(start[i + 2]);
            if (hi < 0 || lo < 0 || (hi == 0 && lo == 0)) {
                free(out);
                return NULL;
            }
            out[n++] = (char)(hi * 16 + lo);
            i += 2;
        } else {
            out[n++] = start[i];
        }
    }
    out[n] = '\0';
    return out;
}

/* Appends [start, start+len) to out at *n. */
static void
append(char *out, size_t *n, const char *start, size_t len)
{
    memcpy(out + *n, start, len);
    *n += len;
}

/* The schemes whose userinfo without ':' is a token (url_redact_token_schemes); NULL: none. */
static const char *const *token_schemes;

void
url_redact_token_schemes(const char *const *schemes)
{
    token_schemes = schemes;
}

/* True for a scheme named by url_redact_token_schemes(): a userinfo without ':' is a token. */
static bool
token_scheme(const char *text, size_t scheme_len)
{
    for (const char *const *p = token_schemes; p != NULL && *p != NULL; p++)
        if (strlen(*p) == scheme_len && strncmp(text, *p, scheme_len) == 0)
            return true;
    return false;
}

size_t
url_scheme_length(const char *text)
{
    size_t len = 0;

    if (!isalpha((unsigned char)text[0]))
        return 0;
    while (isalnum((unsigned char)text[len]) || text[len] == '+' || text[len] == '.' ||
           text[len] == '-')
        len++;
    return strncmp(text + len, "://", 3) == 0 ? len : 0;
}

/* True when the query key [start, start+len), percent-decoded, is "password". */
static bool
key_is_password(const char *start, size_t len)
{
    char *key = url_percent_decode(start, len);
    bool result = key != NULL && strcmp(key, "password") == 0;

    free(key);
    return result;
}

/*
 * Redacts a URI: the password of its userinfo and the value of every
 * "password" query parameter. libpq (postgres:// and postgresql://) ends
 * the userinfo at the first '@' before a '/', url_parse at the last '@'
 * before a '/', '?' or '#'; each form is redacted the way it is read.
 */
static void
redact_uri(const char *text, size_t scheme_len, char *out, size_t *n)
{
    const char *auth = text + scheme_len + 3, *auth_end, *at = NULL, *sep = NULL, *p, *query;
    bool libpq = (scheme_len == 8 && strncmp(text, "postgres", 8) == 0) ||
                 (scheme_len == 10 && strncmp(text, "postgresql", 10) == 0);

    if (libpq) {
        auth_end = auth + strcspn(auth, "/");
        at = memchr(auth, '@', (size_t)(auth_end - auth));
    } else {
        auth_end = auth + strcspn(auth, "/?#");
        for (const char *q = auth; q < auth_end; q++)
            if (*q == '@')
                at = q;
    }
    if (at != NULL)
        sep = memchr(auth, ':', (size_t)(at - auth));
    if (at != NULL && sep == NULL && token_scheme(text, scheme_len)) {
        /* scheme://token@host: the whole userinfo is the secret */
        append(out, n, text, (size_t)(auth - text));
        append(out, n, "***", 3);
        p = at;
    } else if (sep != NULL) {
        append(out, n, text, (size_t)(sep + 1 - text));
        append(out, n, "***", 3);
        p = at;
    } else {
        p = at != NULL ? at : auth;
        append(out, n, text, (size_t)(p - text));
    }
    /* the query, from the first '?' on: key=value separated by '&', keys maybe percent-encoded */
    query = strchr(p, '?');
    while (*p != '\0') {
        if (query != NULL && p > query && (p[-1] == '?' || p[-1] == '&')) {
            size_t key_len = strcspn(p, "=&");

            if (p[key_len] == '=' && key_is_password(p, key_len)) {
                append(out, n, p, key_len + 1);
                append(out, n, "***", 3);
                p += key_len + 1;
                p += strcspn(p, "&");
                continue;
            }
        }
        out[(*n)++] = *p++;
    }
}

/*
 * Redacts a libpq conninfo, read as libpq reads it: keyword, optional
 * spaces, '=', optional spaces, a value either single-quoted or up to the
 * next space, with backslash escapes in both forms.
 */
static void
redact_conninfo(const char *text, char *out, size_t *n)
{
    const char *p = text;

    while (*p != '\0') {
        const char *key = p, *value;
        size_t key_len;

        if (isspace((unsigned char)*p)) {
            out[(*n)++] = *p++;
            continue;
        }
        while (*p != '\0' && *p != '=' && !isspace((unsigned char)*p))
            p++;
        key_len = (size_t)(p - key);
        while (isspace((unsigned char)*p))
            p++;
        if (*p != '=') {
            append(out, n, key, (size_t)(p - key)); /* not a keyword=value: libpq rejects it */
            continue;
        }
        p++;
        while (isspace((unsigned char)*p))
            p++;
        append(out, n, key, (size_t)(p - key));
        value = p;
        if (*p == '\'') {
            p++;
            while (*p != '\0' && *p != '\'') {
                if (*p == '\\' && p[1] != '\0')
                    p++;
                p++;
            }
            if (*p == '\'')
                p++;
        } else {
            while (*p != '\0' && !isspace((unsigned char)*p)) {
                if (*p == '\\' && p[1] != '\0')
                    p++;
                p++;
            }
        }
        if (key_len == 8 && strncmp(key, "password", 8) == 0) {
            append(out, n, "***", 3);
            /* a quoted value may touch the next keyword; "***" unquoted must not */
            if (*p != '\0' && !isspace((unsigned char)*p))
                out[(*n)++] = ' ';
        } else
            append(out, n, value, (size_t)(p - value));
    }
}

char *
url_redact(const char *text)
{
    size_t len, n = 0, scheme_len;
    char *out;

    if (text == NULL)
        return strdup("");
    len = strlen(text);
    /* "***" replaces passwords of any length, even empty ones after "password=" or ":" */
    out = malloc(2 * len + 16);
    if (out == NULL)
        return NULL;
    scheme_len = url_scheme_length(text);
    if (scheme_len > 0)
        redact_uri(text, scheme_len, out, &n);
    else
        redact_conninfo(text, out, &n);
    out[n] = '\0';
    return out;
}

/* ---- passwords in messages -------------------------------------------------- */

/* Passwords a message about one URL or conninfo may quote, whole or in pieces. */
#define SECRETS_MAX 32

struct secrets {
    char *whole[SECRETS_MAX];  /* replaced wherever they appear */
    size_t whole_count;
    char *pieces[SECRETS_MAX]; /* parts of a password libpq may quote alone: replaced in quotes */
    size_t piece_count;
    bool overflow; /* more than fit: every quoted piece of the message is replaced */
};

static void
secrets_add(char **list, size_t *count, bool *overflow, const char *start, size_t len)
{
    if (len == 0)
        return;
    if (*count == SECRETS_MAX) {
        *overflow = true;
        return;
    }
    list[*count] = strndup(start, len);
    if (list[*count] == NULL)
        *overflow = true;
    else
        (*count)++;
}

/* How a password is written where it was found: in a URL, percent-encoded. */
enum password_form { PASSWORD_PLAIN, PASSWORD_PERCENT_ENCODED };

/* Adds a password as written, decoded when percent-encoded, and its pieces between @ / : ? */
static void
secrets_add_password(struct secrets *s, const char *start, size_t len, enum password_form form)
{
    secrets_add(s->whole, &s->whole_count, &s->overflow, start, len);
    if (form == PASSWORD_PERCENT_ENCODED) {
        char *decoded = url_percent_decode(start, len);

        if (decoded != NULL)
            secrets_add(s->whole, &s->whole_count, &s->overflow, decoded, strlen(decoded));
        free(decoded);
    }
    for (size_t i = 0; i < len;) {
        size_t piece = strcspn(start + i, "@/:?&");

        if (piece > len - i)
            piece = len - i;
        if (piece < len)
            secrets_add(s->pieces, &s->piece_count, &s->overflow, start + i, piece);
        i += piece + 1;
    }
}

static void secrets_collect(struct secrets *s, const char *text, int depth);

/*
 * A dbname holding '=' or a URI is read by libpq as a whole conninfo of its
 * own (expand_dbname): its passwords count too.
 */
static void
secrets_collect_dbname(struct secrets *s, const char *value, int depth)
{
    if (depth < 2 && (strchr(value, '=') != NULL || url_scheme_length(value) > 0))
        secrets_collect(s, value, depth + 1);
}

/*
 * The userinfo password of a URI, read three ways, since a password may hold
 * '@', '/' or '?': up to the first '@' before the first '/' (libpq), up to
 * the last '@' before '/', '?' or '#' (url_parse), and up to the last '@' of
 * all. Then every password (and dbname) of the query.
 */
static void
secrets_collect_uri(struct secrets *s, const char *text, size_t scheme_len, int depth)
{
    const char *auth = text + scheme_len + 3, *query;
    const char *ends[3] = {NULL, NULL, NULL};
    const char *slash = auth + strcspn(auth, "/"), *stop = auth + strcspn(auth, "/?#");

    ends[0] = memchr(auth, '@', (size_t)(slash - auth));
    for (const char *p = auth; p < stop; p++)
        if (*p == '@')
            ends[1] = p;
    ends[2] = strrchr(auth, '@');
    for (int i = 0; i < 3; i++) {
        const char *colon = ends[i] ? memchr(auth, ':', (size_t)(ends[i] - auth)) : NULL;

        if (colon != NULL)
            secrets_add_password(s, colon + 1, (size_t)(ends[i] - colon - 1),
                                 PASSWORD_PERCENT_ENCODED);
    }
    query = strchr(auth, '?');
    for (const char *p = query; p != NULL && *p != '\0';) {
        size_t param = strcspn(++p, "&"), key = strcspn(p, "=&");

        if (key < param) {
            char *name = url_percent_decode(p, key);

            if (name != NULL && strcmp(name, "password") == 0) {
                secrets_add_password(s, p + key + 1, param - key - 1, PASSWORD_PERCENT_ENCODED);
            } else if (name != NULL && strcmp(name, "dbname") == 0) {
                char *value = url_percent_decode(p + key + 1, param - key - 1);

                if (value != NULL)
                    secrets_collect_dbname(s, value, depth);
                free(value);
            }
            free(name);
        }
        p += param;
    }
}

/* Each keyword = value of a conninfo, read as libpq reads it (see redact_conninfo). */
static void
secrets_collect_conninfo(struct secrets *s, const char *text, int depth)
{
    const char *p = text;

    while (*p != '\0') {
        const char *key, *value;
        size_t key_len;
        char *plain;
        size_t n = 0;

        while (isspace((unsigned char)*p))
            p++;
        key = p;
        while (*p != '\0' && *p != '=' && !isspace((unsigned char)*p))
            p++;
        key_len = (size_t)(p - key);
        while (isspace((unsigned char)*p))
            p++;
        if (*p != '=') {
            if (*p != '\0' && p == key)
                p++;
            continue;
        }
        p++;
        while (isspace((unsigned char)*p))
            p++;
        value = p;
        plain = malloc(strlen(p) + 1);
        if (plain == NULL) {
            s->overflow = true;
            return;
        }
        if (*p == '\'') {
            for (p++; *p != '\0' && *p != '\''; p++) {
                if (*p == '\\' && p[1] != '\0')
                    p++;
                plain[n++] = *p;
            }
            if (*p == '\'')
                p++;
        } else {
            for (; *p != '\0' && !isspace((unsigned char)*p); p++) {
                if (*p == '\\' && p[1] != '\0')
                    p++;
                plain[n++] = *p;
            }
        }
        plain[n] = '\0';
        if (key_len == 8 && strncmp(key, "password", 8) == 0) {
            secrets_add(s->whole, &s->whole_count, &s->overflow, value, (size_t)(p - value));
            secrets_add_password(s, plain, n, PASSWORD_PLAIN);
        } else if (key_len == 6 && strncmp(key, "dbname", 6) == 0) {
            secrets_collect_dbname(s, plain, depth);
        }
        free(plain);
    }
}

static void
secrets_collect(struct secrets *s, const char *text, int depth)
{
    size_t scheme_len = url_scheme_length(text);

    if (scheme_len > 0)
        secrets_collect_uri(s, text, scheme_len, depth);
    else
        secrets_collect_conninfo(s, text, depth);
}

static void
secrets_clear(struct secrets *s)
{
    for (size_t i = 0; i < s->whole_count; i++) {
        memset(s->whole[i], 0, strlen(s->whole[i]));
        free(s->whole[i]);
    }
    for (size_t i = 0; i < s->piece_count; i++) {
        memset(s->pieces[i], 0, strlen(s->pieces[i]));
        free(s->pieces[i]);
    }
}

/* Longest first, so a password is never half replaced by a shorter one inside it. */
static int
compare_longest_first(const void *a, const void *b)
{
    size_t x = strlen(*(char *const *)a), y = strlen(*(char *const *)b);

    return (x < y) - (x > y);
}

/* What replace_secrets() hides: each secret where it occurs, or the whole range. */
enum secrets_hidden { HIDE_OCCURRENCES, HIDE_WHOLE_RANGE };

/*
 * Replaces in [start, end) of text every occurrence of the secrets with
 * "***", appending to out; or the whole range with HIDE_WHOLE_RANGE.
 */
static void
replace_secrets(const char *start, const char *end, char *const *list, size_t count,
                enum secrets_hidden hide, char *out, size_t *n)
{
    if (hide == HIDE_WHOLE_RANGE) {
        append(out, n, "***", 3);
        return;
    }
    while (start < end) {
        size_t i;

        for (i = 0; i < count; i++) {
            size_t len = strlen(list[i]);

            if (len <= (size_t)(end - start) && memcmp(start, list[i], len) == 0)
                break;
        }
        if (i < count) {
            append(out, n, "***", 3);
            start += strlen(list[i]);
        } else {
            out[(*n)++] = *start++;
        }
    }
}

/* True when p starts "password", any case, then optional spaces and '='; *value after it. */
static bool
password_keyword_at(const char *text, const char *p, const char **value)
{
    if (strncasecmp(p, "password", 8) != 0)
        return false;
    if (p > text && (isalnum((unsigned char)p[-1]) || p[-1] == '_'))
        return false;
    p += 8;
    while (*p == ' ')
        p++;
    if (*p != '=')
        return false;
    p++;
    while (*p == ' ')
        p++;
    *value = p;
    return true;
}

/*
 * The patterns any message may hold without our knowing the URL: the
 * userinfo password of a URI (scheme://user:password@), and the value of
 * "password=" as a conninfo keyword or a URI query parameter, quoted or not.
 */
static void
redact_patterns(const char *text, char *out, size_t *n)
{
    const char *p = text;

    while (*p != '\0') {
        const char *value;

        if (strncmp(p, "://", 3) == 0) {
            const char *auth = p + 3, *end = auth + strcspn(auth, " \t\n\"'"), *at = NULL;
            const char *colon;

            for (const char *q = auth; q < end; q++)
                if (*q == '@')
                    at = q;
            colon = at ? memchr(auth, ':', (size_t)(at - auth)) : NULL;
            append(out, n, p, 3);
            if (colon != NULL) {
                append(out, n, auth, (size_t)(colon + 1 - auth));
                append(out, n, "***", 3);
                p = at;
            } else {
                p = auth;
            }
            continue;
        }
        if (password_keyword_at(text, p, &value)) {
            append(out, n, p, (size_t)(value - p));
            append(out, n, "***", 3);
            p = value;
            if (*p == '\'') {
                for (p++; *p != '\0' && *p != '\''; p++)
                    if (*p == '\\' && p[1] != '\0')
                        p++;
                if (*p == '\'')
                    p++;
            } else {
                while (*p != '\0' && !isspace((unsigned char)*p) && strchr("&\"',;)", *p) == NULL)
                    p++;
            }
            continue;
        }
        out[(*n)++] = *p++;
    }
}

/*
 * Copies text to out at *n with the pieces of s replaced inside double
 * quotes, where libpq quotes what it could not read: pieces of a password
 * too. Ends out with a NUL.
 */
static void
replace_quoted_pieces(const char *text, const struct secrets *s, char *out, size_t *n)
{
    for (const char *p = text; *p != '\0';) {
        const char *close = *p == '"' ? strchr(p + 1, '"') : NULL;

        if (close == NULL) {
            out[(*n)++] = *p++;
            continue;
        }
        out[(*n)++] = '"';
        replace_secrets(p + 1, close, s->pieces, s->piece_count,
                        s->overflow ? HIDE_WHOLE_RANGE : HIDE_OCCURRENCES, out, n);
        out[(*n)++] = '"';
        p = close + 1;
    }
    out[*n] = '\0';
}

void
url_redact_message(const char *message, const char *source, const char *password, char *out,
                   size_t size)
{
    struct secrets s = {0};
    const char *env = getenv("PGPASSWORD");
    size_t len, n = 0, m = 0;
    char *first = NULL, *second = NULL, *third = NULL;

    if (size == 0)
        return;
    if (message == NULL)
        message = "";
    if (source != NULL)
        secrets_collect(&s, source, 0);
    if (password != NULL)
        secrets_add(s.whole, &s.whole_count, &s.overflow, password, strlen(password));
    if (env != NULL)
        secrets_add(s.whole, &s.whole_count, &s.overflow, env, strlen(env));
    qsort(s.whole, s.whole_count, sizeof(*s.whole), compare_longest_first);
    qsort(s.pieces, s.piece_count, sizeof(*s.pieces), compare_longest_first);

    /* each step at most doubles the text plus a little ("***" for anything, even one byte) */
    len = strlen(message);
    first = malloc(3 * len + 16);
    second = malloc(9 * len + 48);
    if (first == NULL || second == NULL) {
        snprintf(out, size, "(message withheld: out of memory)");
        goto done;
    }
    replace_secrets(message, message + len, s.whole, s.whole_count, HIDE_OCCURRENCES, first, &n);
    first[n] = '\0';
    replace_quoted_pieces(first, &s, second, &m);
    /* a pattern adds "***" to at least five bytes ("://:@") */
    third = malloc(2 * m + 16);
    if (third == NULL) {
        snprintf(out, size, "(message withheld: out of memory)");
        goto done;
    }
    n = 0;
    redact_patterns(second, third, &n);
    third[n] = '\0';
    snprintf(out, size, "%s", third);
done:
    free(first);
    free(second);
    free(third);
    secrets_clear(&s);
}
