/*
 * console_auth.c - who may use the console: the token of
 * --auth-token-file as a bearer token or through the login form's session
 * cookie, and the CSRF token that every page of a session carries.
 *
 * Tokens are compared in constant time. A session is 32 random bytes held
 * in memory only: restarting the console logs everybody out. Worker threads
 * share the sessions under console->sessions_lock; a request works on its
 * own copy of its session. Bearer calls
 * need no CSRF token: a browser never adds an Authorization header to a
 * request another site makes it send, so such a call cannot be forged.
 */
#include <errno.h>
#include <stdio.h>
#include <strings.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>

#include <arpa/inet.h>

#include "clock.h"
#include "console_auth.h"

#define TOKEN_MIN_LENGTH 16
#define TOKEN_MAX_LENGTH 4096
#define COOKIE_NAME "outbox_session="

bool
console_auth_equal(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    unsigned char diff = la == lb ? 0 : 1;

    /* walks b whatever a holds, so the time says nothing about where they differ */
    for (size_t i = 0; i < lb; i++)
        diff |= (unsigned char)(a[i < la ? i : 0] ^ b[i]);
    return diff == 0 && la > 0;
}

int
console_auth_random_hex(char *out, size_t size)
{
    static const char digits[] = "0123456789abcdef";
    unsigned char bytes[64];
    size_t want = (size - 1 + 1) / 2;

    if (size < 2 || want > sizeof(bytes))
        return -1;
    if (getrandom(bytes, want, 0) != (ssize_t)want)
        return -1;
    for (size_t i = 0; i + 1 < size; i++)
        out[i] = digits[(bytes[i / 2] >> (i % 2 ? 0 : 4)) & 0xf];
    out[size - 1] = '\0';
    return 0;
}

/* True when token holds only visible ASCII characters: no spaces, no control characters. */
static bool
token_is_visible(const char *token)
{
    for (const unsigned char *p = (const unsigned char *)token; *p != '\0'; p++)
        if (*p <= ' ' || *p >= 0x7f)
            return false;
    return true;
}

int
console_auth_load(struct console *console, const char *path)
{
    char line[TOKEN_MAX_LENGTH + 2];
    FILE *file = fopen(path, "r");
    struct stat st;
    size_t length;

    if (file == NULL || fstat(fileno(file), &st) != 0) {
        fprintf(stderr, "outboxctl: unable to read --auth-token-file '%s': %s\n", path,
                strerror(errno));
        if (file != NULL)
            fclose(file);
        return -1;
    }
    if ((st.st_mode & (S_IRWXG | S_IRWXO)) != 0) { /* as ssh refuses a private key */
        fclose(file);
        fprintf(stderr, "outboxctl: --auth-token-file '%s' is open to group or others "
                        "(mode %04o): chmod 600 it\n", path, (unsigned)(st.st_mode & 07777));
        return -1;
    }
    if (fgets(line, sizeof(line), file) == NULL)
        line[0] = '\0';
    fclose(file);
    length = strcspn(line, "\r\n");
    while (length > 0 && (line[length - 1] == ' ' || line[length - 1] == '\t'))
        length--;
    line[length] = '\0';
    if (length < TOKEN_MIN_LENGTH || length > TOKEN_MAX_LENGTH || !token_is_visible(line)) {
        fprintf(stderr, "outboxctl: --auth-token-file '%s': the token (its first line) must "
                        "be %d to %d printable characters without spaces\n", path,
                TOKEN_MIN_LENGTH, TOKEN_MAX_LENGTH);
        return -1;
    }
    console->token = strdup(line);
    if (console->token == NULL) {
        fputs("outboxctl: out of memory\n", stderr);
        return -1;
    }
    return 0;
}

/* The value of the session cookie in a Cookie header, copied into out; false when none. */
static bool
session_cookie(const char *header, char *out, size_t size)
{
    const char *p = header;

    while (p != NULL && *p != '\0') {
        while (*p == ' ' || *p == ';')
            p++;
        if (strncmp(p, COOKIE_NAME, strlen(COOKIE_NAME)) == 0) {
            size_t length;

            p += strlen(COOKIE_NAME);
            length = strcspn(p, "; ");
            if (length == 0 || length >= size)
                return false;
            memcpy(out, p, length);
            out[length] = '\0';
            return true;
        }
        p = strchr(p, ';');
    }
    return false;
}

/* ---- failed logins ---- */

/* The failure entry of peer (a free or the stalest one, reset, when none); under sessions_lock. */
static int
failure_entry(struct console *console, const char *peer, int64_t now)
{
    int stalest = 0;

    for (int i = 0; i < CONSOLE_LOGIN_ADDRESSES; i++) {
        if (strcmp(console->login_failures[i].peer, peer) == 0) {
            if (now - console->login_failures[i].window_ms >= CONSOLE_LOGIN_WINDOW_SECONDS * 1000) {
                console->login_failures[i].window_ms = now;
                console->login_failures[i].failures = 0;
            }
            return i;
        }
        if (console->login_failures[i].window_ms < console->login_failures[stalest].window_ms)
            stalest = i;
    }
    snprintf(console->login_failures[stalest].peer, sizeof(console->login_failures[0].peer), "%s",
             peer);
    console->login_failures[stalest].window_ms = now;
    console->login_failures[stalest].failures = 0;
    return stalest;
}

bool
console_auth_throttled(struct console *console, const char *peer)
{
    bool throttled;

    pthread_mutex_lock(&console->sessions_lock);
    throttled = console->login_failures[failure_entry(console, peer, clock_monotonic_ms())]
                    .failures >= CONSOLE_LOGIN_FAILURES_MAX;
    pthread_mutex_unlock(&console->sessions_lock);
    return throttled;
}

void
console_auth_failed(struct console *console, const char *peer)
{
    pthread_mutex_lock(&console->sessions_lock);
    console->login_failures[failure_entry(console, peer, clock_monotonic_ms())].failures++;
    pthread_mutex_unlock(&console->sessions_lock);
    fprintf(stderr, "outboxctl serve: failed login from %s\n", peer);
}

/* ---- who a request is ---- */

/* True when authorization says Bearer (the scheme in any case, RFC 7235); *token after it. */
static bool
bearer_token(const char *authorization, const char **token)
{
    if (authorization == NULL || strncasecmp(authorization, "Bearer ", 7) != 0)
        return false;
    *token = authorization + 7 + strspn(authorization + 7, " ");
    return true;
}

void
console_auth_identify(struct console *console, struct console_request *request)
{
    const char *token;

    char cookie[CONSOLE_TOKEN_HEX + 1];

    request->identity = CONSOLE_NOBODY;
    request->session = NULL;
    if (console->token == NULL) {
        request->identity = CONSOLE_ANONYMOUS;
        request->session = &console->anonymous;
        snprintf(request->who, sizeof(request->who), "anonymous@%s", request->peer);
        return;
    }
    if (bearer_token(request->authorization, &token)) {
        /* past its failed logins an address is refused even the right token: no more guesses */
        if (console_auth_throttled(console, request->peer)) {
            request->throttled = true;
            return;
        }
        if (!console_auth_equal(token, console->token))
            return console_auth_failed(console, request->peer);
        request->identity = CONSOLE_BEARER;
        snprintf(request->who, sizeof(request->who), "bearer@%s", request->peer);
        return;
    }
    if (request->cookie == NULL || !session_cookie(request->cookie, cookie, sizeof(cookie)))
        return;
    pthread_mutex_lock(&console->sessions_lock);
    for (int i = 0; i < CONSOLE_MAX_SESSIONS; i++) {
        struct console_session *session = &console->sessions[i];

        if (session->created != 0 && console_auth_equal(cookie, session->id)) {
            request->identity = CONSOLE_COOKIE;
            request->session_copy = *session;
            request->session = &request->session_copy;
            snprintf(request->who, sizeof(request->who), "session %.8s@%s", session->id,
                     request->peer);
            break;
        }
    }
    pthread_mutex_unlock(&console->sessions_lock);
}

bool
console_auth_csrf_ok(const struct console_request *request, const char *form_csrf)
{
    const char *given = request->csrf_header ? request->csrf_header : form_csrf;

    if (request->session == NULL || given == NULL)
        return false;
    return console_auth_equal(given, request->session->csrf);
}

bool
console_auth_login(struct console *console, const char *token, struct console_session *opened)
{
    struct console_session *slot = &console->sessions[0];
    bool ok = true;

    if (console->token == NULL || token == NULL || !console_auth_equal(token, console->token))
        return false;
    pthread_mutex_lock(&console->sessions_lock);
    for (int i = 0; i < CONSOLE_MAX_SESSIONS; i++) {
        if (console->sessions[i].created < slot->created)
            slot = &console->sessions[i];
    }
    if (console_auth_random_hex(slot->id, sizeof(slot->id)) < 0 ||
        console_auth_random_hex(slot->csrf, sizeof(slot->csrf)) < 0) {
        memset(slot, 0, sizeof(*slot));
        ok = false;
    } else {
        slot->created = ++console->session_counter;
        *opened = *slot;
    }
    pthread_mutex_unlock(&console->sessions_lock);
    return ok;
}

void
console_auth_logout(struct console *console, struct console_request *request)
{
    if (request->identity == CONSOLE_COOKIE && request->session != NULL) {
        pthread_mutex_lock(&console->sessions_lock);
        for (int i = 0; i < CONSOLE_MAX_SESSIONS; i++) {
            struct console_session *session = &console->sessions[i];

            if (session->created != 0 && console_auth_equal(request->session->id, session->id))
                memset(session, 0, sizeof(*session));
        }
        pthread_mutex_unlock(&console->sessions_lock);
    }
    request->session = NULL;
}

/* ---- Host and Origin ---- */

bool
console_auth_host_name_valid(const char *name)
{
    size_t length = strlen(name);
    unsigned char v6[16];
    char inner[64];

    if (length == 0 || length > 253)
        return false;
    if (name[0] == '[') { /* an IPv6 address */
        if (name[length - 1] != ']' || length - 2 >= sizeof(inner))
            return false;
        memcpy(inner, name + 1, length - 2);
        inner[length - 2] = '\0';
        return inet_pton(AF_INET6, inner, v6) == 1;
    }
    return strspn(name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-") ==
           length;
}

/* True when name (as in Host: brackets around IPv6) is an IP address. */
static bool
is_ip_address(const char *name)
{
    unsigned char v4[4];

    return inet_pton(AF_INET, name, v4) == 1 ||
           (name[0] == '[' && console_auth_host_name_valid(name));
}

bool
console_auth_host_ok(const struct console *console, const char *authority,
                     const char *default_port)
{
    static const char *const loopback_names[] = {"localhost", "127.0.0.1", "[::1]"};
    const struct console_hosts *hosts = &console->hosts;
    char name[256];
    const char *port, *colon;
    size_t length;

    if (authority == NULL)
        return false;
    colon = strrchr(authority, ':');
    if (colon != NULL && strchr(colon, ']') != NULL)
        colon = NULL; /* a colon inside an IPv6 address */
    length = colon ? (size_t)(colon - authority) : strlen(authority);
    port = colon ? colon + 1 : default_port;
    if (length >= sizeof(name))
        return false;
    memcpy(name, authority, length);
    name[length] = '\0';
    if (!console_auth_host_name_valid(name) || strspn(port, "0123456789") != strlen(port))
        return false;
    for (size_t i = 0; i < hosts->allowed_count; i++)
        if (strcasecmp(name, hosts->allowed[i]) == 0)
            return true;
    if (strcmp(port, hosts->port) != 0)
        return false;
    if (hosts->loopback || hosts->every_address)
        for (size_t i = 0; i < sizeof(loopback_names) / sizeof(loopback_names[0]); i++)
            if (strcasecmp(name, loopback_names[i]) == 0)
                return true;
    if (hosts->every_address)
        return is_ip_address(name);
    return strcasecmp(name, hosts->listen_host) == 0;
}

bool
console_auth_origin_ok(const struct console *console, const char *origin)
{
    if (strncmp(origin, "http://", 7) == 0)
        return console_auth_host_ok(console, origin + 7, "80");
    if (strncmp(origin, "https://", 8) == 0)
        return console_auth_host_ok(console, origin + 8, "443");
    return false; /* "null" (a sandboxed or opaque origin), or no origin of the web */
}
