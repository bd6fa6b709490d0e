/*
 * listen_addr.c - parsing of a listen address (see listen_addr.h).
 */
#include "listen_addr.h"

#include <stdio.h>
#include <string.h>

int
listen_addr_parse(const char *text, struct listen_addr *addr, struct outbox_error *err)
{
    const char *colon, *host, *port;
    size_t host_len;
    unsigned value = 0;

    memset(addr, 0, sizeof(*addr));
    if (text == NULL)
        text = "";
    if (strcmp(text, "off") == 0) {
        addr->off = true;
        return 0;
    }
    if (text[0] == '[') {
        const char *close = strchr(text, ']');

        if (close == NULL || close[1] != ':')
            goto invalid;
        host = text + 1;
        host_len = (size_t)(close - host);
        colon = close + 1;
    } else {
        colon = strrchr(text, ':');
        if (colon == NULL)
            goto invalid;
        host = text;
        host_len = (size_t)(colon - text);
        if (memchr(host, ':', host_len) != NULL)
            goto invalid; /* IPv6 needs brackets */
    }
    port = colon + 1;
    if (host_len >= sizeof(addr->host) || port[0] == '\0' || strlen(port) > 5)
        goto invalid;
    for (const char *p = port; *p != '\0'; p++) {
        if (*p < '0' || *p > '9')
            goto invalid;
        value = value * 10 + (unsigned)(*p - '0');
    }
    if (value > 65535)
        goto invalid;
    memcpy(addr->host, host, host_len);
    addr->host[host_len] = '\0';
    snprintf(addr->port, sizeof(addr->port), "%u", value & 0xffffu);
    return 0;

invalid:
    memset(addr, 0, sizeof(*addr));
    return outbox_error_set(err, OUTBOX_ERR_CONFIG,
                            "invalid --metrics-addr '%s': expected HOST:PORT or off", text);
}
