/*
 * key_inversion.h - a stream key whose commit order is not its job id
 * order, for the tests of a key's order across a rebase (issue 47, case 7):
 * a transaction that drew its job id before another one of its key and
 * committed after it.
 */
#ifndef OUTBOX_TEST_KEY_INVERSION_H
#define OUTBOX_TEST_KEY_INVERSION_H

#include <stddef.h>

#include <hiredis/hiredis.h>
#include <libpq-fe.h>

/*
 * Installs on conn's database a trigger that holds the insert of a row with
 * payload n = 2 (after its job id was drawn, before the stream trigger takes
 * its key's lock) while the advisory lock 4747 is held.
 */
void key_inversion_install(PGconn *conn);

/*
 * Queue ev's key key gets rows n = 1, 3, 2 in that commit order, where the
 * transaction of 2 took its transaction id after 3's and its job id before
 * 3's: its place (its own transaction id) sorts after 3's, its job id
 * before. control is a session of url's database.
 */
void key_inversion_make(PGconn *control, const char *url, const char *key);

/*
 * Fails the test unless each of the count keys went out in stream as the
 * digits of order say (n = 1, 3, 2: "132").
 */
void key_inversion_assert_kept(redisContext *redis, const char *stream, const char *const *keys,
                               size_t count, const char *order);

#endif
