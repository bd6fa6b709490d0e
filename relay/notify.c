/*
 * notify.c - sd_notify(3) datagrams to the service manager, without libsystemd.
 */
#include "notify.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "error.h"

int
notify_send(const char *state, struct outbox_error *err)
{
    const char *path = getenv("NOTIFY_SOCKET");
    struct sockaddr_un address;
    size_t path_length;
    socklen_t address_length;
    ssize_t sent;
    int fd;

    if (path == NULL || path[0] == '\0')
        return 0;
    path_length = strlen(path);
    if ((path[0] != '/' && path[0] != '@') || path_length >= sizeof(address.sun_path)) {
        outbox_error_set(err, OUTBOX_ERR_CONFIG, "unusable NOTIFY_SOCKET (not a socket path)");
        return -1;
    }
    memset(&address, 0, sizeof(address));
    address.sun_family = AF_UNIX;
    memcpy(address.sun_path, path, path_length);
    if (path[0] == '@')
        address.sun_path[0] = '\0'; /* the abstract namespace */
    address_length = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + path_length);

    fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        outbox_error_set(err, OUTBOX_ERR_CONNECTION, "unable to notify the service manager: %s",
                         strerror(errno));
        return -1;
    }
    sent = sendto(fd, state, strlen(state), MSG_NOSIGNAL, (struct sockaddr *)&address,
                  address_length);
    if (sent < 0) {
        int saved = errno;

        close(fd);
        outbox_error_set(err, OUTBOX_ERR_CONNECTION, "unable to notify the service manager: %s",
                         strerror(saved));
        return -1;
    }
    close(fd);
    return 0;
}

uint64_t
notify_watchdog_usec(void)
{
    const char *usec = getenv("WATCHDOG_USEC"), *pid = getenv("WATCHDOG_PID");
    unsigned long long value;
    char *end;

    if (usec == NULL || usec[0] == '\0')
        return 0;
    /* the watchdog belongs to another process when WATCHDOG_PID names one */
    if (pid != NULL && pid[0] != '\0' && strtol(pid, NULL, 10) != (long)getpid())
        return 0;
    errno = 0;
    value = strtoull(usec, &end, 10);
    if (errno != 0 || *end != '\0' || value == 0)
        return 0;
    return (uint64_t)value;
}
