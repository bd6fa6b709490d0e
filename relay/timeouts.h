/*
 * timeouts.h - the broker's connect, I/O and heartbeat times, in one place.
 *
 * The relay gives these to every sink it opens, and sink.c falls back to
 * the same values when a caller leaves a time at 0, so the two can never
 * disagree. A broker module reads them from struct sink_options and never
 * keeps its own default for them.
 */
#ifndef OUTBOX_TIMEOUTS_H
#define OUTBOX_TIMEOUTS_H

/* Connecting and the broker's handshake (TCP, TLS, login), per endpoint. */
#define TIMEOUT_BROKER_CONNECT_MS 5000

/* The longest wait for the broker without progress (a publish, a confirm, a reply). */
#define TIMEOUT_BROKER_IO_MS 10000

/* Heartbeat interval the relay asks of brokers that have one (AMQP); 0 disables. */
#define TIMEOUT_BROKER_HEARTBEAT_SECONDS 30

#endif
