/*
 * keyslot.h - Redis Cluster hash slots of keys.
 *
 * Redis Cluster puts every key in one of 16384 slots: CRC16 (XMODEM:
 * polynomial 0x1021, initial value 0) of the key, modulo 16384. When the key
 * holds a hash tag - a '{' followed later by a '}' with at least one byte
 * between them, the first such pair - only the bytes between those braces
 * are hashed, so "{user1000}.following" and "{user1000}.followers" share a
 * slot. The Redis sink uses this to send each stream's script call to the
 * master that owns the stream, and to name dedup records so that they land
 * in their stream's slot.
 */
#ifndef OUTBOX_KEYSLOT_H
#define OUTBOX_KEYSLOT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KEYSLOT_COUNT 16384

/* CRC16-XMODEM of len bytes, as Redis computes it. */
uint16_t keyslot_crc16(const char *bytes, size_t len);

/*
 * Finds the hash tag of a key: true with *start and *len set to the bytes
 * between the braces when the key has one, false when the whole key is
 * hashed.
 */
bool keyslot_tag(const char *key, size_t key_len, size_t *start, size_t *len);

/* The slot of a key, 0 .. KEYSLOT_COUNT - 1. */
unsigned keyslot_of(const char *key, size_t key_len);

#endif
