/*
 * wait.c - poll() on a stop latch and one descriptor, with a deadline.
 */
#include "wait.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <stdint.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "clock.h"

int
wait_latch_open(struct wait_latch *latch, struct outbox_error *err)
{
    latch->fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (latch->fd < 0)
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "unable to create an eventfd: %s",
                                strerror(errno));
    return 0;
}

void
wait_latch_close(struct wait_latch *latch)
{
    if (latch->fd >= 0)
        close(latch->fd);
    latch->fd = -1;
}

void
wait_latch_set(struct wait_latch *latch)
{
    uint64_t one = 1;
    int saved = errno;

    /* never read: the counter stays above zero, the fd readable; a full counter is set already */
    if (write(latch->fd, &one, sizeof(one)) < 0) {
        /* nothing to do: EAGAIN means it is set */
    }
    errno = saved;
}

bool
wait_latch_is_set(const struct wait_latch *latch)
{
    struct pollfd pfd = {.fd = latch->fd, .events = POLLIN};

    return poll(&pfd, 1, 0) > 0;
}

/* Milliseconds from now to deadline for poll(), rounded up so a wait never ends early. */
static int
timeout_to(double deadline)
{
    double ms;

    if (deadline < 0)
        return -1;
    ms = ceil((deadline - clock_monotonic_seconds()) * 1000);
    if (ms <= 0)
        return 0;
    return ms > INT_MAX ? INT_MAX : (int)ms;
}

enum wait_result
wait_until(const struct wait_latch *stop, int fd, double deadline)
{
    struct pollfd pfd[2] = {{.fd = stop->fd, .events = POLLIN}, {.fd = fd, .events = POLLIN}};

    for (;;) {
        int timeout = timeout_to(deadline);
        int ready = poll(pfd, fd >= 0 ? 2 : 1, timeout);

        if (ready < 0 && errno != EINTR)
            return WAIT_TIMEOUT; /* EINVAL, ENOMEM: nothing to wait on; the caller goes on */
        if (ready > 0 && pfd[0].revents != 0)
            return WAIT_STOPPED;
        if (ready > 0 && fd >= 0 && pfd[1].revents != 0)
            return WAIT_READY;
        if (ready == 0 && timeout == 0)
            return WAIT_TIMEOUT;
    }
}

enum wait_result
wait_ms(const struct wait_latch *stop, int fd, int ms)
{
    return wait_until(stop, fd, clock_monotonic_seconds() + (ms > 0 ? ms : 0) / 1000.0);
}
