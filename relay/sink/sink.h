/*
 * sink.h - one small interface in front of every broker.
 *
 * The relay loop publishes a batch of claimed rows through a sink and gets
 * back, per message, whether the broker durably accepted it. The loop never
 * knows which broker it talks to: sink_new() picks the implementation by
 * the URL scheme, from the registry in sink_registry.c. This header holds
 * only what every broker shares: the URL and its endpoints, the password,
 * the size limit, the timeouts and the per-message fields; a broker's own
 * options, operations and URL path rules stay in its module.
 *
 * Rules:
 * - A message is SINK_ACCEPTED only when the broker confirmed it (e.g. an
 *   AMQP publisher confirm, a Redis append reply or the dedup record of an
 *   earlier append). Anything unknown is a failure, so a row is never
 *   marked succeeded on a guess.
 * - A failure of one message (unroutable, nack, too large, a reply error,
 *   the broker closing the channel because of that message) fails that
 *   message only; the rest of the batch goes on.
 * - A failure that is no message's own (connection or channel lost, broker
 *   down or busy, no answer in time) defers the messages it touched:
 *   SINK_DEFERRED, which costs the row no attempt.
 * - When the connection breaks, sink_publish() defers every message it
 *   could not confirm, returns -1 with a transient error, and the sink is
 *   left disconnected; the next sink_connect() reconnects.
 * - A URL may list several endpoints (amqp://u:p@h1:p1,h2:p2/vhost, the
 *   nodes of one cluster). The sink starts at a random one, so that many
 *   relays spread over the nodes; sink_connect() tries each in turn from
 *   there and keeps the first that answers; after a lost connection the
 *   next sink_connect() starts at the endpoint after the lost one.
 * - A sink is used by one thread at a time.
 */
#ifndef OUTBOX_SINK_H
#define OUTBOX_SINK_H

#include <stddef.h>
#include <stdint.h>

#include "option.h"
#include "outbox.h"
#include "url.h"

/* RabbitMQ's default max_message_size; the default limit of every sink. */
#define SINK_DEFAULT_MAX_MESSAGE_BYTES ((size_t)128 * 1024 * 1024)

/* Most brokers the registry may hold (the size of sink_options.broker_config). */
#define SINK_BROKER_MAX 8

/*
 * What every broker reads. A broker's own options (--exchange, --stream-prefix,
 * ...) fill its own configuration, opaque here: broker_config[i] belongs to
 * the registry's broker i, allocated and freed by sink_options_init() and
 * sink_options_clear(). A slot left NULL means that broker's defaults.
 */
struct sink_options {
    const char *url;           /* broker URL, with password: never log it */
    const char *password;      /* overrides the URL's password when not NULL; never logged */
    const char *password_file; /* --broker-password-file: config.c reads it into password */
    int connect_timeout_ms;    /* connect and handshake; 0: TIMEOUT_BROKER_CONNECT_MS */
    int io_timeout_ms;         /* longest wait without progress; 0: TIMEOUT_BROKER_IO_MS */
    int64_t max_message_bytes; /* larger payloads are SINK_REJECTED; 0 = 128 MiB (RabbitMQ's default) */
    void *broker_config[SINK_BROKER_MAX]; /* each broker's own options, by registry row */
};

/*
 * Allocates every broker's configuration in options (its defaults; the
 * option rows' fallbacks are applied by whoever parses them). 0, or -1
 * with OUTBOX_ERR_INTERNAL. sink_options_clear() frees them (strings the
 * rows filled included) and leaves the slots NULL; it is a no-op on NULL
 * slots.
 */
int sink_options_init(struct sink_options *options, struct outbox_error *err);
void sink_options_clear(struct sink_options *options);

/*
 * The slot of broker kind's configuration in options ("amqp": a struct
 * sink_amqp_config, see the broker's header), or NULL for an unknown kind.
 * For tests and tools that set a broker's options without parsing them; a
 * configuration stored there by hand stays the caller's.
 */
void **sink_options_broker(struct sink_options *options, const char *kind);

/* The longest message id with its NUL (store_identity.h: STORE_MESSAGE_ID_MAX). */
#define SINK_MESSAGE_ID_MAX 96

/*
 * A row's place in the order of a stream partition (a stream queue's row,
 * or one its disabled stream handed to the claims). A broker may keep an
 * order record, how far each order was published, instead of one dedup
 * record per message; the others ignore it. NULL order: the row has none.
 */
struct sink_order_place {
    const char *order; /* the partition within the queue: "<epoch>:<partition>" */
    const char *at;    /* the row in it: 39 digits, ordered as text */
    /*
     * Every row of the order at or before this place is published or has
     * left the order, and the messages of a publish with this order and
     * floor are the rows right after it, in order (the stream's read);
     * NULL: neither is known (rows the claims publish).
     */
    const char *floor;
    /*
     * The row's own identity (its message_uid), for a row with a place: a
     * broker's order record names the last row appended in turn by it, so
     * that a record of another history (a crash that lost commits whose
     * places were appended) is told apart from the database's; NULL: none.
     */
    const char *uid;
    /*
     * The relay's answer to a check the broker asked for (sink_outcome.check):
     * "ok" or "gone" followed by the check, NULL for none.
     */
    const char *verdict;
};

/* One header of a message beyond the row's: a name and a NUL-terminated value. */
struct sink_header {
    const char *name;
    const char *value;
};

/* Most extra headers one message carries. */
#define SINK_EXTRA_HEADERS_MAX 32

/* One message to publish, built from a claimed row. */
struct sink_message {
    int64_t job_id;      /* the row's job id, sent beside the message id */
    /*
     * The id consumers deduplicate on: "<database>:<message_uid>", or on a
     * database that kept an earlier form "<database>:<epoch>:<job_id>" or
     * the bare job id; ".r<n>" follows for a row replayed n times. dedup_id
     * is the form "<database>:<message_uid>" whatever the database's, for
     * the keys a broker deduplicates on (Redis' dedup records, NATS'
     * Nats-Msg-Id); history is the database's history's name
     * (store_identity.h: history_name), which names a stream partition's
     * order record (see struct sink_order_place).
     */
    char message_id[SINK_MESSAGE_ID_MAX];
    char dedup_id[SINK_MESSAGE_ID_MAX];
    const char *history;
    int32_t attempt;     /* the claim generation, sent with the message */
    const char *queue;   /* the row's queue */
    const char *payload; /* JSON text, the body */
    size_t payload_len;
    const char *headers; /* JSON object of string values */
    double created_at;   /* epoch seconds */
    int32_t replay;      /* times the row was replayed (a broker that deduplicates keys on it) */
    /*
     * Where the row asks to go: its exchange and routing_key columns, read by
     * each broker its own way (see the broker's module); a broker that has
     * no use for one ignores it. NULL: the broker's default.
     */
    const char *exchange;
    const char *routing_key;
    const char *ordering_key; /* the row's ordering key (Kafka: the record key); NULL: none */
    struct sink_order_place place;
    /*
     * What the relay's CloudEvents module (relay/cloudevents.h) adds; NULL
     * and 0 when it is off, and the message is as it always was. The body's
     * media type (AMQP: content_type; the others: a "content-type" header
     * or field), and headers after the row's and the sink's own, named for
     * this broker's binding already (sink_cloudevents_prefix): each broker
     * sends them as it sends the row's.
     */
    const char *content_type;
    const struct sink_header *extra_headers;
    size_t extra_header_count;
};

/* What happened to one message. */
enum sink_status {
    SINK_ACCEPTED = 0, /* the broker has it durably */
    SINK_FAILED,       /* not published; worth retrying later */
    SINK_REJECTED,     /* not published and never will be as is (e.g. too large) */
    SINK_DEFERRED,     /* maybe not published, through no fault of its own: give it back
                          without spending an attempt */
};

#define SINK_REASON_MAX 256

/* A check: a place (39 digits) and the identity of the row there (36 characters, or none). */
#define SINK_CHECK_SIZE 80

struct sink_outcome {
    enum sink_status status;
    char reason[SINK_REASON_MAX]; /* lowercase, for last_error; empty when accepted */
    /*
     * Set, with SINK_DEFERRED, when the broker's order record says rows up to
     * a place after the floor were appended, by a row the database must
     * hold for that to be true: "<place><uid>" (the uid empty when the
     * record names none). The caller publishes the message again with a
     * verdict (sink_order_place.verdict). Empty otherwise.
     */
    char check[SINK_CHECK_SIZE];
};

/*
 * Fills one outcome, its check cleared; reason is formatted like printf, may
 * be NULL. The sinks fill theirs with it, and so does the relay for the
 * messages it does not hand them.
 */
void sink_outcome_set(struct sink_outcome *outcome, enum sink_status status, const char *format,
                      ...) __attribute__((format(printf, 3, 4)));

typedef struct sink sink;

/*
 * The registry's options, group by group for --help and parsing: group 0
 * holds the options every broker reads (--broker, --max-message-bytes),
 * each further group one broker's own. Returns the rows (count in *count)
 * and the group's title ("broker", or the broker's kind), NULL past the
 * last group.
 */
const struct option_spec *sink_option_group(size_t index, const char **title, size_t *count);

/*
 * Where group index's rows write: options itself for group 0, else that
 * broker's configuration (NULL until sink_options_init()).
 */
void *sink_option_group_target(struct sink_options *options, size_t index);

/*
 * For --help, from the registry: every broker's product ("RabbitMQ, Redis
 * Streams, NATS JetStream or Kafka"), and what --check verifies beyond the
 * connection ("--exchange exists", joined by " and "; "" when nothing).
 */
const char *sink_products(void);
const char *sink_check_help(void);

/* The kind ("amqp") of the broker whose scheme url starts with, or NULL. */
const char *sink_kind_of_url(const char *url);

/* Parses a broker URL by every scheme of the registry (see url_parse). */
int sink_url_parse(const char *text, struct broker_url *url, struct outbox_error *err);

/*
 * Validates the options (scheme, URL shape, the broker's own options)
 * without connecting. Returns NULL and fills err (OUTBOX_ERR_CONFIG, the
 * message naming the option at fault) on a bad URL or option.
 */
sink *sink_new(const struct sink_options *options, struct outbox_error *err);
void sink_free(sink *s);

/* The broker's kind ("amqp"), for logs and metrics labels. */
const char *sink_kind(const sink *s);

/*
 * The prefix of a CloudEvents attribute's header in binary mode, as the
 * broker's protocol binding names them ("ce_" for Kafka's "ce_id").
 */
const char *sink_cloudevents_prefix(const sink *s);

/* The URL with any password replaced by "***", for logs. */
const char *sink_display_url(const sink *s);

/*
 * Connects (or reconnects) and authenticates. A no-op when connected.
 * Authentication or a missing vhost/db is OUTBOX_ERR_CONFIG; an unreachable
 * broker is OUTBOX_ERR_CONNECTION. With several endpoints each is tried
 * once, from sink_endpoint() on; when none answers, err names how many were
 * tried and the last failure, and is OUTBOX_ERR_CONFIG if any endpoint
 * refused the login (a configuration error, not an outage).
 */
int sink_connect(sink *s, struct outbox_error *err);
bool sink_is_connected(const sink *s);

/*
 * Publishes count messages and waits (bounded by io_timeout_ms) until the
 * broker has answered for each. outcomes[i] is always filled for every i,
 * also when -1 is returned (connection lost: the unconfirmed ones are
 * SINK_DEFERRED).
 */
int sink_publish(sink *s, const struct sink_message *messages, size_t count,
                 struct sink_outcome *outcomes, struct outbox_error *err);

/*
 * For --check, on a connected sink: checks that what publishing needs
 * exists on the broker (AMQP: the --exchange). 0, or -1 with
 * OUTBOX_ERR_CONFIG naming what is missing (the sink is then disconnected),
 * or another code when the broker could not be asked.
 */
int sink_check(sink *s, struct outbox_error *err);

/*
 * For a broker whose servers copy what it takes to replicas before a
 * message is accepted: what the start-up line and --check report. The
 * strings are the sink's, valid until its next connect.
 */
struct sink_replication {
    /* after a connect: each server that takes appends and how many replicas it
       has ("10.0.0.5:6379 has 2 replicas; ..."); "" when not known */
    const char *replicas;
    int wait;                /* how many replicas must acknowledge, resolved by the URL */
    const char *wait_option; /* the option that sets wait, for --check ("--redis-wait") */
    const char *wait_field;  /* wait's name in a log line ("redis_wait") */
};

/*
 * Fills replication (wait 0 and "" strings for a broker without replicas to
 * wait for); true when there is something to report: replicas known.
 */
bool sink_replication(const sink *s, struct sink_replication *replication);

/*
 * Tells the sink how long a row may be redelivered after its first publish
 * (the lease plus the longest retry delay), before it connects: a broker
 * that deduplicates within a window compares its window with it. Unknown
 * (never set, or 0): nothing to compare. A no-op for the other brokers.
 */
void sink_set_redelivery_horizon(sink *s, int64_t horizon_ms);

/*
 * Keeps an idle connection alive (AMQP heartbeats, closed channels). Call
 * at least every few seconds while idle. Returns -1 when the connection
 * was found broken.
 */
int sink_idle(sink *s, struct outbox_error *err);

/* Closes the connection politely; the sink can connect again later. */
void sink_disconnect(sink *s);

/*
 * How many endpoints the sink chooses between: the nodes of an AMQP URL (1
 * for a single host). 0 when the sink uses its URL's endpoints together
 * (Redis Sentinel asks the sentinels, Cluster reads the slots from the
 * seeds): then no endpoint is "the one in use".
 */
size_t sink_endpoint_count(const sink *s);

/* "host:port" ("[v6]:port") of endpoint index, without secrets: for logs and metric labels. */
const char *sink_endpoint_name(const sink *s, size_t index);

/* The index of the endpoint connected to, or of the one the next sink_connect() tries first. */
size_t sink_endpoint(const sink *s);

/*
 * Connects to endpoint index and no other (for --check), disconnecting
 * first when connected. Errors as sink_connect().
 */
int sink_connect_endpoint(sink *s, size_t index, struct outbox_error *err);

#endif
