/*
 * keyslot.c - Redis Cluster hash slots of keys.
 */
#include "keyslot.h"

#include <string.h>

uint16_t
keyslot_crc16(const char *bytes, size_t len)
{
    uint16_t crc = 0;

    /* bit by bit: a slot is computed once per message, a table would not pay for itself */
    for (size_t i = 0; i < len; i++) {
        crc ^= (uint16_t)((uint16_t)(unsigned char)bytes[i] << 8);
        for (int bit = 0; bit < 8; bit++)
            crc = (crc & 0x8000) != 0 ? (uint16_t)((crc << 1) ^ 0x1021) : (uint16_t)(crc << 1);
    }
    return crc;
}

bool
keyslot_tag(const char *key, size_t key_len, size_t *start, size_t *len)
{
    const char *open = memchr(key, '{', key_len), *close;
    size_t after;

    if (open == NULL)
        return false;
    after = (size_t)(open - key) + 1;
    close = memchr(open + 1, '}', key_len - after);
    /* "{}" or no closing brace: Redis hashes the whole key */
    if (close == NULL || close == open + 1)
        return false;
    *start = after;
    *len = (size_t)(close - open) - 1;
    return true;
}

unsigned
keyslot_of(const char *key, size_t key_len)
{
    size_t start, len;

    if (keyslot_tag(key, key_len, &start, &len))
        return keyslot_crc16(key + start, len) & (KEYSLOT_COUNT - 1);
    return keyslot_crc16(key, key_len) & (KEYSLOT_COUNT - 1);
}
