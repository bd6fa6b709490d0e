"""checker.py - judges one cell's observed history against the relay's promises.

It knows nothing of the relay: its inputs are what the broker holds (read by brokers.py),
the table at the end, and what the producers recorded. The promises, from README.md and
docs/design.md:

  lost         every committed row is delivered
  rolled       nothing is delivered that no committed row holds (rolled back, prepared
               then rolled back, a savepoint rolled back)
  duplicate    at most one append per job where the broker promises it (Redis' dedup
               record, NATS' duplicate window), replays excepted
  order        per ordering key, first deliveries in the commit order of the producing
               transactions, job_id order within one
  unpublished  nothing marked succeeded (or behind a stream cursor) that the broker lacks
  dead         dead rows only where a row is bad by construction
  counts       `outboxctl status` and /metrics agree with the table at the end

check() returns the per-promise counts and one line per violation, naming the rows.
"""

import json
from collections import Counter

PROMISES = ["lost", "rolled", "duplicate", "order", "unpublished", "dead", "counts"]


def parse(delivery):
    try:
        payload = json.loads(delivery)
        return payload if isinstance(payload, dict) and "u" in payload else None
    except ValueError:
        return None


def expected(cell):
    """The tokens of committed rows that are not bad by construction: each must be delivered."""
    rows = cell["rows"]
    committed = set(cell["committed"]) | {t for t in cell["uncertain"] if t in rows}
    # a repeated idempotency key inserts nothing: the earlier row of that key stands for it
    keys_in_table = {(r["db"], r.get("idempotency_key")) for r in rows.values()}
    for token, (letter, key) in cell.get("idempotent", {}).items():
        if token in committed and token not in rows and (letter, key) in keys_in_table:
            committed.discard(token)
    return committed - set(cell["bad"])


def check(cell):
    """cell: {name, at_most_once, deliveries [payload text], rows {token: row},
    committed, uncertain, bad, replayed (sets of tokens), counts [(what, expected, got)]}.
    rows[token] = {db, job_id, state, published (bool or None)}."""
    counts = Counter({promise: 0 for promise in PROMISES})
    lines = []

    def violation(promise, text):
        counts[promise] += 1
        if counts[promise] <= 20:
            lines.append("violation cell=%s promise=%s %s" % (cell["name"], promise, text))

    rows = cell["rows"]
    delivered = Counter()
    first = []
    for text in cell["deliveries"]:
        payload = parse(text)
        if payload is None:
            violation("rolled", "message=%r (not a row of this run)" % text[:80])
            continue
        token = payload["u"]
        delivered[token] += 1
        if delivered[token] == 1:
            first.append(payload)

    def name(token):
        row = rows.get(token)
        if row is None:
            return "token=%s (not in the table)" % token
        return "db=%s job_id=%s token=%s state=%s" % (row["db"], row["job_id"], token, row["state"])

    good = expected(cell)
    for token in sorted(good):
        if token not in rows:
            violation("lost", "%s: committed but missing from the table" % name(token))
        elif delivered[token] == 0:
            violation("lost", "%s: committed, never delivered" % name(token))
    for token in sorted(delivered):
        if token not in rows:
            violation("rolled", "%s: delivered %d time(s)" % (name(token), delivered[token]))
    if cell["at_most_once"]:
        for token, times in sorted(delivered.items()):
            if times > 1 and token not in cell["replayed"]:
                violation("duplicate", "%s: delivered %d times" % (name(token), times))

    last = {}
    for payload in first:
        token, key = payload["u"], payload.get("k")
        row = rows.get(token)
        if key is None or row is None or payload.get("n") is None:
            continue
        place = (payload["n"], row["job_id"])
        scope = (row["db"], key)
        if scope in last and place < last[scope][0]:
            violation("order", "key=%s: %s (counter %s) delivered after %s (counter %s)"
                      % (key, name(token), place[0], name(last[scope][1]), last[scope][0][0]))
        else:
            last[scope] = (place, token)

    for token, row in sorted(rows.items()):
        published = row["state"] == "succeeded" or row.get("published")
        if published and delivered[token] == 0:
            violation("unpublished", "%s: marked published, not in the broker" % name(token))
        if row["state"] == "dead" and token not in cell["bad"]:
            violation("dead", "%s: dead, not bad by construction (%s)" % (name(token), row.get("error")))

    for what, table, got in cell["counts"]:
        if table != got:
            violation("counts", "%s: table says %s, it says %s" % (what, table, got))

    summary = {"delivered": len(delivered), "committed": len(good)}
    return counts, lines, summary


def plant(cell, rng):
    """The self-test: one violation of each kind planted in an observed history.
    Returns the names planted; the checker must report every one."""
    deliveries = cell["deliveries"]
    planted = []
    # lost: a committed row's only delivery dropped
    seen = Counter(parse(d)["u"] for d in deliveries if parse(d))
    for index, text in enumerate(deliveries):
        payload = parse(text)
        if payload and seen[payload["u"]] == 1 and payload["u"] in cell["committed"]:
            del deliveries[index]
            planted.append("lost")
            break
    # order: two first deliveries of one key swapped
    by_key = {}
    for index, text in enumerate(deliveries):
        payload = parse(text)
        if payload and payload.get("k") and payload["u"] in cell["rows"]:
            by_key.setdefault(payload["k"], []).append(index)
    for indexes in by_key.values():
        if len(indexes) >= 2:
            i, j = indexes[0], indexes[-1]
            deliveries[i], deliveries[j] = deliveries[j], deliveries[i]
            planted.append("order")
            break
    # duplicate: a delivery repeated where at most one is promised
    cell["at_most_once"] = True
    deliveries.append(deliveries[len(deliveries) // 2])
    planted.append("duplicate")
    # rolled: a rolled-back row delivered
    if cell["rolled"]:
        token = rng.choice(sorted(cell["rolled"]))
        deliveries.insert(rng.randrange(len(deliveries) + 1),
                          cell["rolled"][token] or json.dumps({"u": token}))
        planted.append("rolled")
    return planted
