/*
 * test_keyslot.c - Redis Cluster hash slots, against values Redis 7 gives for CLUSTER KEYSLOT.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include "keyslot.h"

static unsigned
slot(const char *key)
{
    return keyslot_of(key, strlen(key));
}

static void
test_crc16_check_value(void **state)
{
    (void)state;
    /* the CRC16-XMODEM check value Redis' cluster specification gives */
    assert_int_equal(keyslot_crc16("123456789", 9), 0x31C3);
    assert_int_equal(keyslot_crc16("", 0), 0);
}

static void
test_plain_keys(void **state)
{
    (void)state;
    assert_int_equal(slot("foo"), 12182);
    assert_int_equal(slot("bar"), 5061);
    assert_int_equal(slot("hello"), 866);
    assert_int_equal(slot("123456789"), 12739);
    assert_int_equal(slot("orders"), 105);
}

static void
test_hash_tags(void **state)
{
    size_t start = 99, len = 99;

    (void)state;
    assert_int_equal(slot("{user1000}.following"), 3443);
    assert_int_equal(slot("{user1000}.followers"), 3443);
    assert_int_equal(slot("{orders}:outbox-dedup:1"), slot("orders"));
    /* the first '{' and the first '}' after it; an empty tag hashes the whole key */
    assert_int_equal(slot("foo{bar}{zap}"), 5061);
    assert_int_equal(slot("foo{{bar}}zap"), 4015);
    assert_int_equal(slot("foo{}{bar}"), 8363);
    assert_int_equal(slot("{}"), 15257);
    assert_int_equal(slot("a{b"), 13340);
    assert_true(keyslot_tag("x{ab}y", 6, &start, &len));
    assert_int_equal(start, 2);
    assert_int_equal(len, 2);
    assert_false(keyslot_tag("x{}y", 4, &start, &len));
    assert_false(keyslot_tag("plain", 5, &start, &len));
    /* a tag beyond the given length does not count */
    assert_false(keyslot_tag("ab{cd}", 4, &start, &len));
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_crc16_check_value),
        cmocka_unit_test(test_plain_keys),
        cmocka_unit_test(test_hash_tags),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
