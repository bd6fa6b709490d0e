/*
 * console_chart.h - the overview's chart of the last hour (rows enqueued
 * and published per minute), with the minutes that are over counted once.
 *
 * At 500 000 rows published in the hour, counting the whole hour cost the
 * overview most of its time (0.8-1.5 s). A minute that ended more than
 * CONSOLE_CHART_FINAL_SECONDS ago is kept per database, shared by the
 * workers, and only the minutes since are counted at each request; the
 * whole hour is counted again every CONSOLE_CHART_RECOUNT_SECONDS, so rows
 * that a transaction open across the minute committed late, or a purge
 * removed, show within that time.
 */
#ifndef OUTBOX_CONSOLE_CHART_H
#define OUTBOX_CONSOLE_CHART_H

#include <libpq-fe.h>

#include "store_console.h"

#define CONSOLE_CHART_FINAL_SECONDS 120  /* a minute over this long is kept */
#define CONSOLE_CHART_RECOUNT_SECONDS 300 /* then the whole hour is counted again */
#define CONSOLE_CHART_DATABASES 64        /* databases kept; beyond, the oldest goes */

/* Fills chart for the database named database on conn; 0, or -1 with err. */
int console_chart(PGconn *conn, const char *database, struct store_console_chart *chart,
                  struct outbox_error *err);

#endif
