/*
 * listen_addr.h - the address a server of ours listens on: "HOST:PORT",
 * "[IPV6]:PORT", ":PORT" (all interfaces) or "off".
 *
 * Shared by the relay's --metrics-addr and the console's --listen; plain
 * string work, no I/O.
 */
#ifndef OUTBOX_LISTEN_ADDR_H
#define OUTBOX_LISTEN_ADDR_H

#include <stdbool.h>

#include "error.h"

struct listen_addr {
    bool off;       /* "off": no server */
    char host[256]; /* "" = all interfaces; IPv6 without brackets */
    char port[8];   /* decimal, "0" = any free port */
};

/*
 * Parses text into addr. 0, or -1 with OUTBOX_ERR_CONFIG naming the bad
 * value.
 */
int listen_addr_parse(const char *text, struct listen_addr *addr, struct outbox_error *err);

#endif
