/*
 * url_check.h - a database URL checked as libpq reads it, without connecting.
 *
 * The relay's --database-url and outboxctl's share this check, so a URL
 * libpq would refuse is a configuration error (exit 2) before any connection
 * is tried; libpq's reason is redacted, since it quotes the URL.
 */
#ifndef OUTBOX_URL_CHECK_H
#define OUTBOX_URL_CHECK_H

#include "outbox.h"

/*
 * Parses a libpq URI or conninfo as libpq will (PQconninfoParse, and a
 * dbname that is itself a URI or conninfo), without connecting. 0, or -1
 * with OUTBOX_ERR_CONFIG and libpq's reason, redacted.
 */
int url_check_database(const char *text, struct outbox_error *err);

#endif
