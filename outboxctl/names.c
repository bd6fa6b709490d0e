/* names.c - the names an operator types, checked before any connection. */
#include "names.h"

#include <stdio.h>
#include <string.h>

bool
names_queue_valid(const char *queue)
{
    static const char allowed[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                  "abcdefghijklmnopqrstuvwxyz0123456789._:-";
    size_t length;

    if (queue == NULL)
        return false;
    length = strlen(queue);
    return length >= 1 && length <= NAMES_QUEUE_MAX && strspn(queue, allowed) == length;
}

bool
names_check(const char *queue, const char *key, char *message, size_t size)
{
    char shown[64];
    size_t n = 0;

    if (names_queue_valid(queue)) {
        if (key == NULL || key[0] != '\0')
            return true;
        snprintf(message, size, "an ordering key must not be empty");
        return false;
    }
    /* the name as the terminal should see it: one line, no escape sequences */
    for (const char *p = queue != NULL ? queue : ""; *p != '\0' && n + 1 < sizeof(shown); p++)
        shown[n++] = (unsigned char)*p < 0x20 || *p == 0x7f ? ' ' : *p;
    shown[n] = '\0';
    snprintf(message, size, "invalid queue name '%s': 1 to %d characters of A-Z a-z 0-9 . _ : -",
             shown, NAMES_QUEUE_MAX);
    return false;
}
