/*
 * httpd_listen.c - the listening socket of the shared HTTP server: an
 * address resolved, bound and listened on, with the loopback rule of a
 * console that has no token (see httpd.h).
 */
#include "httpd.h"

#include <errno.h>
#include <netdb.h>
#include <stdbool.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>

#include "error.h"

bool
httpd_address_is_loopback(const struct sockaddr *address)
{
    if (address->sa_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)(const void *)address)->sin_addr.s_addr) >>
                24) == 127;
    if (address->sa_family == AF_INET6)
        return IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6 *)(const void *)address)->sin6_addr);
    return false;
}

/* True when every address of list is a loopback one (a host name may have several). */
static bool
all_loopback(const struct addrinfo *list)
{
    for (const struct addrinfo *ai = list; ai != NULL; ai = ai->ai_next)
        if (!httpd_address_is_loopback(ai->ai_addr))
            return false;
    return true;
}

/* The port fd is bound to; 0 when unknown. */
static int
bound_port(int fd)
{
    struct sockaddr_storage bound;
    socklen_t bound_len = sizeof(bound);

    if (getsockname(fd, (struct sockaddr *)&bound, &bound_len) != 0)
        return 0;
    if (bound.ss_family == AF_INET)
        return ntohs(((struct sockaddr_in *)&bound)->sin_port);
    if (bound.ss_family == AF_INET6)
        return ntohs(((struct sockaddr_in6 *)&bound)->sin6_port);
    return 0;
}

int
httpd_listen(const struct listen_addr *addr, const char *what, bool loopback_only, int *listen_fd,
             int *port, struct outbox_error *err)
{
    struct addrinfo hints, *list = NULL, *ai;
    const char *shown_host = addr->host[0] ? addr->host : "*";
    int fd = -1, rc, saved_errno = 0;

    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    rc = getaddrinfo(addr->host[0] ? addr->host : NULL, addr->port, &hints, &list);
    if (rc != 0)
        return outbox_error_set(err, OUTBOX_ERR_CONFIG, "unable to resolve %s '%s:%s': %s", what,
                                shown_host, addr->port, gai_strerror(rc));
    if (loopback_only && (addr->host[0] == '\0' || !all_loopback(list))) {
        freeaddrinfo(list);
        return outbox_error_set(err, OUTBOX_ERR_INVALID, "'%s' is not a loopback address",
                                shown_host);
    }
    for (ai = list; ai != NULL; ai = ai->ai_next) {
        int one = 1;

        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) {
            saved_errno = errno;
            continue;
        }
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, SOMAXCONN) == 0)
            break;
        saved_errno = errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(list);
    if (fd < 0)
        return outbox_error_set(err, OUTBOX_ERR_CONFIG, "unable to listen on %s '%s:%s': %s", what,
                                shown_host, addr->port, strerror(saved_errno));
    *listen_fd = fd;
    if (port != NULL)
        *port = bound_port(fd);
    return 0;
}
