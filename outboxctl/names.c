/* names.c - the names an operator types, checked before any connection. */
#include "names.h"

#include <string.h>

bool
names_queue_valid(const char *queue)
{
    static const char allowed[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:-";
    size_t length;

    if (queue == NULL)
        return false;
    length = strlen(queue);
    return length >= 1 && length <= NAMES_QUEUE_MAX && strspn(queue, allowed) == length;
}
