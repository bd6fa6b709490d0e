"""checker.py - judges one cell's observed history against the relay's promises.

It knows nothing of the relay: its inputs are what the broker holds (read by brokers.py),
the table and its transition log at the end, and what the producers and faults recorded.
The promises, from README.md, docs/design.md and CONTRACT.md:

  lost         every committed row is delivered; after a history fault (histories.py), every
               row of the history the database ends on: a row committed inside a fault's
               window and missing from the table (a lost branch) may be delivered or not
  swallowed    no two rows carry one message id (the id a consumer deduplicates on: NATS'
               Outbox-Message-Id header, elsewhere the message id), so that a consumer that
               deduplicates as the README says drops none; a row copied into two histories
               is one row (its token), a row created after a split must not reuse an id
  rolled       nothing is delivered that no committed row holds (rolled back, prepared
               then rolled back, a savepoint rolled back)
  duplicate    at most 1 + replays appends per job where the broker promises it (Redis'
               dedup record, NATS' duplicate window), within its window; elsewhere counted,
               not bounded
  replay       a replayed job appended exactly 1 + replays times where that is promised
               (Redis: once more per replay, even inside the dedup window)
  order        per ordering key, first deliveries in the commit order of the producing
               transactions, job_id order within one
  unpublished  nothing marked succeeded (or behind a stream cursor) that the broker lacks
  dead         dead rows only where a row is bad by construction
  refused      a row bad by construction ends dead and is never delivered
  fence        every move of a row out of `running` but a reap is made by its owner: the
               session (relay) and worker of the latest claim, the claim's generation,
               before the lease ends; nothing finishes a row that is not running
  reap         a reap moves an expired row to `ready` or `dead`, never before its lease ends
  content      a message carries its row: the whole payload, the job id (field or header),
               a message id naming the job, the row's headers
  early        nothing delivered before the row's run_at (row-state cells of brokers that
               say when they took a message; stream rows ignore run_at, docs/stream.md)
  paused       no row of a paused queue claimed while the pause holds (row-state claims)
  counts       `outboxctl status` and /metrics agree with the table at the end

check() returns the per-promise counts, one line per violation naming the rows, and a
summary with the paths the run exercised (rows reaped, claimed again, published again,
kept from a second append by the dedup, replayed; duplicates).
"""

import json
import re
from collections import Counter

PROMISES = ["lost", "swallowed", "rolled", "duplicate", "replay", "order", "unpublished", "dead", "refused",
            "fence", "reap", "content", "early", "paused", "counts"]
# the paths only faults that hit rows in flight exercise
WINDOW_PATHS = ["reaped", "republished"]
TRANSITION_FIELDS = ["seq", "job_id", "old_state", "new_state", "old_worker", "new_worker",
                     "old_attempts", "new_attempts", "old_lease", "last_error", "actor", "at",
                     "token"]
# a fenced write checks its lease with clock_timestamp() a moment before the log's own
LEASE_SLACK_SECONDS = 0.2
# a broker's stamp may lag the moment it took a message: Redis stamps entries with the time
# it cached before a stall (SIGSTOP) ended; stalls last under 2 s
BROKER_CLOCK_SLACK_SECONDS = 2.0


def payload_text(delivery):
    return delivery["payload"] if isinstance(delivery, dict) else delivery


def unwrap(delivery):
    """(the row's payload a delivery carries or None, the structured CloudEvent's id or None)."""
    try:
        payload = json.loads(payload_text(delivery))
    except ValueError:
        return None, None
    event = None
    if isinstance(payload, dict) and "specversion" in payload:
        event, payload = payload.get("id"), payload.get("data")
    return (payload if isinstance(payload, dict) and "u" in payload else None), event


def parse(delivery):
    """The row's payload a delivery carries (a structured CloudEvent's data), or None."""
    return unwrap(delivery)[0]


def expected(cell):
    """The tokens of committed rows that are not bad by construction: each must be delivered."""
    rows = cell["rows"]
    committed = set(cell["committed"]) | {t for t in cell["uncertain"] if t in rows}
    # a repeated idempotency key inserts nothing: the earlier row of that key stands for it
    keys_in_table = {(r["db"], r.get("idempotency_key")) for r in rows.values()}
    keys_in_table |= set(cell.get("copied_keys", ()))
    for token, (letter, key) in cell.get("idempotent", {}).items():
        if token in committed and token not in rows and (letter, key) in keys_in_table:
            committed.discard(token)
    # a history fault's lost branch: its rows missing from the table are not owed
    lost_branch = {t for t in cell.get("branch", ()) if t not in rows}
    return committed - set(cell["bad"]) - lost_branch


class Judge:
    def __init__(self, cell):
        self.cell = cell
        self.rows = cell["rows"]
        self.counts = Counter({promise: 0 for promise in PROMISES})
        self.lines = []

    def violation(self, promise, text):
        self.counts[promise] += 1
        if self.counts[promise] <= 20:
            self.lines.append("violation cell=%s promise=%s %s" % (self.cell["name"], promise, text))

    def name(self, token):
        row = self.rows.get(token)
        if row is None:
            return "token=%s (not in the table)" % token
        return "db=%s job_id=%s token=%s state=%s" % (row["db"], row["job_id"], token, row["state"])

    # ---- what the broker holds

    def read_deliveries(self):
        self.delivered, self.first, self.times = Counter(), [], {}
        self.carriers = {}  # consumer's message id -> tokens carrying it
        for delivery in self.cell["deliveries"]:
            payload, event = unwrap(delivery)
            if payload is None:
                self.violation("rolled", "message=%r (not a row of this run)" % payload_text(delivery)[:80])
                continue
            token = payload["u"]
            self.delivered[token] += 1
            if isinstance(delivery, dict):
                self.content(token, payload, delivery, event)
                consumer_id = (delivery.get("headers") or {}).get("Outbox-Message-Id") or delivery.get("message_id")
                if consumer_id is not None:
                    self.carriers.setdefault(consumer_id, set()).add(token)
                if delivery.get("at") is not None:
                    self.times.setdefault(token, []).append(delivery["at"])
            if self.delivered[token] == 1:
                self.first.append(payload)

    def content(self, token, payload, delivery, event):
        row = self.rows.get(token)
        if row is None:
            return
        wrong = []
        if payload != row["payload"]:
            wrong.append("payload %.60s, the table's %.60s" % (json.dumps(payload), json.dumps(row["payload"])))
        if delivery.get("job_id") is not None and str(delivery["job_id"]) != str(row["job_id"]):
            wrong.append("job id %s" % delivery["job_id"])
        message_id = delivery.get("message_id")
        # <database_id>:<message_uid> (the form of a new database), or an earlier form's
        # <database_id>:<epoch>:<job_id> / <job_id>; a replay adds .r<n>
        named = re.sub(r"\.r[0-9]+$", "", message_id).split(":")[-1] if message_id is not None else None
        if named is not None and named not in (str(row["job_id"]), row.get("message_uid")):
            wrong.append("message id %s" % message_id)
        if event is not None and message_id is not None and event != message_id:
            wrong.append("event id %s, the message id %s" % (event, message_id))
        headers = delivery.get("headers")
        if headers is not None:
            got = {str(k).lower(): v for k, v in headers.items()}
            for key, value in row["headers"].items():
                if got.get(key.lower()) != value:
                    wrong.append("header %s=%r, the row's %r" % (key, got.get(key.lower()), value))
        if wrong:
            self.violation("content", "%s: %s" % (self.name(token), "; ".join(wrong)))

    def delivered_rows(self):
        cell, delivered = self.cell, self.delivered
        for token in sorted(expected(cell)):
            if token not in self.rows:
                self.violation("lost", "%s: committed but missing from the table" % self.name(token))
            elif delivered[token] == 0:
                self.violation("lost", "%s: committed, never delivered" % self.name(token))
        for message_id, tokens in sorted(self.carriers.items()):
            if len(tokens) > 1:
                self.violation("swallowed", "message id %s carried by %s: a consumer deduplicating on it"
                               " drops all but one" % (message_id, ", ".join(self.name(t) for t in sorted(tokens))))
        branch = cell.get("branch", set())
        for token in sorted(delivered):
            if token not in self.rows and token not in branch:
                self.violation("rolled", "%s: delivered %d time(s)" % (self.name(token), delivered[token]))
        for token in sorted(cell["bad"]):
            if delivered[token]:
                self.violation("refused", "%s: bad by construction, delivered %d time(s)"
                               % (self.name(token), delivered[token]))
            if token in self.rows and self.rows[token]["state"] != "dead":
                self.violation("refused", "%s: bad by construction, not dead" % self.name(token))

    def duplicates(self):
        """Extra deliveries, counted everywhere; bounded where the broker promises."""
        extra = 0
        histories = self.cell.get("histories", set())
        for token, times in sorted(self.delivered.items()):
            row = self.rows.get(token)
            replays = row["replays"] if row else 0
            if row is None and token in self.cell["replayed"]:
                replays = times  # a row gone from the table: its replays are unknown
            # a history fault may take a row's replays back: the replays asked for stand
            forgotten = row["db"] in histories if row else bool(histories)
            if forgotten:
                replays = max(replays, self.cell.get("replay_counts", {}).get(token, 0))
            extra += max(0, times - 1 - replays)
            # appends further apart than the broker's dedup window are not promised away
            stamps, window = self.times.get(token), self.cell.get("dedup_window")
            beyond = bool(stamps and window and max(stamps) - min(stamps) > window)
            # docs/stream.md: across a history change a stream publishes the rows after the
            # cursor it finds again (same message id): counted, not bounded
            beyond = beyond or (forgotten and self.cell.get("mode") == "stream")
            if self.cell["at_most_once"] and times > 1 + replays and not beyond:
                self.violation("duplicate", "%s: delivered %d times, replayed %d" % (self.name(token), times, replays))
            if (self.cell.get("exact_replays") and row and replays > 0 and row["state"] == "succeeded"
                    and times != 1 + replays and not forgotten):
                self.violation("replay", "%s: replayed %d times, delivered %d times" % (self.name(token), replays, times))
        return extra

    def order(self):
        """Serialising producers' keys (and late ones' in stream mode): first deliveries in
        (counter, job_id) order. Late producers' keys in row-state mode: no row delivered
        after a row of its key with both a later counter (committed after it) and a larger
        job_id (design.md: job_id order among the rows committed)."""
        last, late_rows = {}, {}
        for payload in self.first:
            token, key = payload["u"], payload.get("k")
            row = self.rows.get(token)
            if key is None or row is None:
                continue
            n = row["late"] if row.get("late") is not None else payload.get("n")
            if n is None:
                continue
            scope = (row["db"], key)
            if row.get("late") is not None and self.cell.get("mode") == "row":
                late_rows.setdefault(scope, []).append((row["job_id"], n, token))
                continue
            place = (n, row["job_id"])
            if scope in last and place < last[scope][0]:
                self.violation("order", "key=%s: %s (counter %s) delivered after %s (counter %s)"
                               % (key, self.name(token), place[0], self.name(last[scope][1]), last[scope][0][0]))
            else:
                last[scope] = (place, token)
        for (letter, key), deliveries in sorted(late_rows.items()):
            self.dominated(key, deliveries)

    def dominated(self, key, deliveries):
        """deliveries: (job_id, counter, token) in delivery order; a violation for each one
        delivered after another with a larger job_id and a larger counter (a Fenwick tree
        over job_id ranks keeps the largest counter delivered so far above each rank)."""
        ranks = {job_id: i for i, job_id in enumerate(sorted(d[0] for d in deliveries))}
        size = len(ranks)
        tree = [(-1, None)] * (size + 1)  # over reversed ranks: a prefix is the larger job_ids
        for job_id, n, token in deliveries:
            i, best = size - ranks[job_id] - 1, (-1, None)  # job_ids above this one
            while i > 0:
                best = max(best, tree[i], key=lambda b: b[0])
                i -= i & -i
            if best[0] > n:
                self.violation("order", "key=%s: %s (counter %s) delivered after %s (counter %s), a later"
                               " job committed later" % (key, self.name(token), n, self.name(best[1]), best[0]))
            i = size - ranks[job_id]
            while i <= size:
                tree[i] = max(tree[i], (n, token), key=lambda b: b[0])
                i += i & -i

    def table(self):
        for token, row in sorted(self.rows.items()):
            published = row["state"] == "succeeded" or row.get("published")
            if published and self.delivered[token] == 0:
                self.violation("unpublished", "%s: marked published, not in the broker%s"
                               % (self.name(token), self.story(row)))
            if row["state"] == "dead" and token not in self.cell["bad"]:
                self.violation("dead", "%s: dead, not bad by construction (%s)" % (self.name(token), row.get("error")))
            times = self.times.get(token)
            # docs/stream.md: a stream row goes out in its place whatever its run_at
            # a retry or a reap moves run_at on: rows claimed once keep the one they were given
            if times and row["replays"] == 0 and row["attempts"] <= 1 and self.cell.get("mode") != "stream" and \
                    min(times) < row["run_at"] - BROKER_CLOCK_SLACK_SECONDS:
                self.violation("early", "%s: delivered %.2f s before its run_at" % (self.name(token), row["run_at"] - min(times)))
        for what, table, got in self.cell["counts"]:
            if table != got:
                self.violation("counts", "%s: table says %s, it says %s" % (what, table, got))

    # ---- the transition log

    def transitions(self):
        """The fence, the reaper's writes and the pauses, from the transition log; returns
        (reaps, claims of a row claimed before, the reaps' times per job)."""
        claims, reaps, reclaims, reaped_at = {}, 0, 0, {}
        for t in self.cell.get("transitions", []):
            job = (t["db"], t["job_id"])
            if t["new_state"] == "running" and t["old_state"] != "running":
                reclaims += job in claims
                claims[job] = t
                self.paused_claim(t)
                continue
            if t["new_state"] == "succeeded" and t["old_state"] not in ("running", "stream"):
                self.violation("fence", "%s: %s -> succeeded by %s, a row it did not hold"
                               % (self.log_name(t), t["old_state"], t["actor"]))
            if t["old_state"] != "running" or t["new_state"] in ("running", "stream"):
                continue
            if (t["last_error"] or "").startswith("lease expired") and t["new_worker"] is None \
                    and t["new_attempts"] == t["old_attempts"]:
                reaps += 1
                reaped_at.setdefault(job, []).append(t["at"])
                self.reap(t)
            else:
                self.fenced(t, claims.get(job))
        return reaps, reclaims, reaped_at

    def story(self, row):
        """The row's transitions, oldest first (' [stream->succeeded by a at 12.3, ...]')."""
        steps = ["%s->%s by %s at %.1f" % (t["old_state"], t["new_state"], t["actor"], t["at"] % 1000)
                 for t in self.cell.get("transitions", [])
                 if (t["db"], t["job_id"]) == (row["db"], row["job_id"])]
        return " [%s]" % ", ".join(steps) if steps else ""

    def log_name(self, t):
        return "db=%s job_id=%s token=%s (log seq %s)" % (t["db"], t["job_id"], t["token"], t["seq"])

    def reap(self, t):
        if t["new_state"] not in ("ready", "dead"):
            self.violation("reap", "%s: reaped to %s by %s" % (self.log_name(t), t["new_state"], t["actor"]))
        if t["old_lease"] is not None and t["at"] < t["old_lease"]:
            self.violation("reap", "%s: reaped %.3f s before its lease ended" % (self.log_name(t), t["old_lease"] - t["at"]))

    def fenced(self, t, claim):
        move = "running -> %s by %s" % (t["new_state"], t["actor"])
        if claim is None:
            self.violation("fence", "%s: %s, no claim of it logged" % (self.log_name(t), move))
        elif (claim["actor"], claim["new_worker"], claim["new_attempts"]) != (t["actor"], t["old_worker"], t["old_attempts"]):
            self.violation("fence", "%s: %s (worker %s generation %s), claimed by %s (worker %s generation %s)"
                           % (self.log_name(t), move, t["old_worker"], t["old_attempts"], claim["actor"],
                              claim["new_worker"], claim["new_attempts"]))
        elif t["old_lease"] is not None and t["at"] > t["old_lease"] + LEASE_SLACK_SECONDS:
            self.violation("fence", "%s: %s %.2f s after its lease ended" % (self.log_name(t), move, t["at"] - t["old_lease"]))

    def paused_claim(self, t):
        for letter, start, end in self.cell.get("pauses", []):
            if letter == t["db"] and start < t["at"] < end:
                self.violation("paused", "%s: claimed by %s %.2f s into a pause of its queue"
                               % (self.log_name(t), t["actor"], t["at"] - start))

    def republished(self, reaped_at):
        """Rows the claim that was reaped had published (the broker took them well before
        the reap), so published again by the next claim: how many, and how many of them the
        broker holds once (its dedup kept the second append out). Without the broker's
        times: reaped rows delivered more than once."""
        again = kept_out = 0
        for token, row in self.rows.items():
            reaps = reaped_at.get((row["db"], row["job_id"]))
            if row["replays"] or not reaps or not self.delivered[token]:
                continue
            times = self.times.get(token)
            if times is None:
                again += self.delivered[token] > 1
            elif min(times) < max(reaps) - BROKER_CLOCK_SLACK_SECONDS:
                again += 1
                kept_out += self.delivered[token] == 1
        return again, kept_out


def check(cell):
    """cell: {name, at_most_once, exact_replays, deliveries [delivery dicts or payload texts],
    rows {token: row}, committed, uncertain, bad, replayed (sets of tokens), counts
    [(what, expected, got)], transitions [log rows], pauses [(db letter, from, to)]}."""
    judge = Judge(cell)
    judge.read_deliveries()
    judge.delivered_rows()
    extra = judge.duplicates()
    judge.order()
    judge.table()
    reaps, reclaims, reaped_at = judge.transitions()
    again, kept_out = judge.republished(reaped_at)
    paths = {"reaped": reaps, "reclaimed": reclaims, "republished": again,
             "deduplicated": kept_out if cell["at_most_once"] else "-",
             "replayed": sum(r["replays"] for r in judge.rows.values()), "duplicates": extra,
             "most_attempts": max((r["attempts"] for t, r in judge.rows.items() if t not in cell["bad"]),
                                  default=0),
             "lost_branch": sum(1 for t in cell.get("branch", ()) if t not in judge.rows and t in cell["committed"]),
             "lost_branch_delivered": sum(1 for t in cell.get("branch", ()) if t not in judge.rows
                                          and t in cell["committed"] and judge.delivered[t])}
    summary = {"delivered": len(judge.delivered), "committed": len(expected(cell)), "paths": paths}
    return judge.counts, judge.lines, summary


def plant(cell, rng):
    """The self-test: one violation of every kind planted in an observed history.
    Returns the names planted; the checker must report every one."""
    deliveries, rows = cell["deliveries"], cell["rows"]
    planted = []
    seen = Counter(parse(d)["u"] for d in deliveries if parse(d))
    # lost and unpublished: a succeeded row's only delivery dropped
    for index, delivery in enumerate(deliveries):
        payload = parse(delivery)
        token = payload and payload["u"]
        if token and seen[token] == 1 and token in cell["committed"] and rows.get(token, {}).get("state") == "succeeded":
            del deliveries[index]
            planted += ["lost", "unpublished"]
            break
    # order: two first deliveries of one key swapped
    by_key = {}
    for index, delivery in enumerate(deliveries):
        payload = parse(delivery)
        if payload and payload.get("k") and payload["u"] in rows:
            by_key.setdefault((rows[payload["u"]]["db"], payload["k"]), []).append(index)
    for indexes in by_key.values():
        if len(indexes) >= 2:
            i, j = indexes[0], indexes[-1]
            deliveries[i], deliveries[j] = deliveries[j], deliveries[i]
            planted.append("order")
            break
    # swallowed: a message id carried by two rows
    carried = [d for d in deliveries if isinstance(d, dict) and parse(d) and d.get("message_id")]
    for other in carried[1:]:
        if parse(other)["u"] != parse(carried[0])["u"]:
            other["message_id"] = carried[0]["message_id"]
            planted.append("swallowed")
            break
    # duplicate: a delivery repeated where at most one is promised
    cell["at_most_once"] = True
    deliveries.append(deliveries[len(deliveries) // 2])
    planted.append("duplicate")
    # rolled: a rolled-back row delivered
    if cell["rolled"]:
        token = rng.choice(sorted(cell["rolled"]))
        deliveries.insert(rng.randrange(len(deliveries) + 1),
                          {"payload": cell["rolled"][token] or json.dumps({"u": token})})
        planted.append("rolled")
    planted += plant_rows(cell, rng)
    return planted


def plant_rows(cell, rng):
    """The kinds judged from the table, its log and what a message carries."""
    deliveries, rows, planted = cell["deliveries"], cell["rows"], []
    good = sorted(t for t, r in rows.items() if r["state"] == "succeeded" and t not in cell["bad"]
                  and r["replays"] == 0)
    token, replayed, dead = rng.sample(good, 3)
    row = rows[token]
    # dead, replay: a good row dead; a replayed row delivered once only
    rows[dead]["state"] = "dead"
    cell["exact_replays"] = True
    rows[replayed]["replays"] = 1
    planted += ["dead", "replay"]
    # content and early: a delivery carrying another job id, taken before its row's run_at
    for delivery in deliveries:
        if isinstance(delivery, dict) and parse(delivery) and parse(delivery)["u"] == token:
            delivery["job_id"] = str(row["job_id"] + 1)
            delivery["at"] = row["run_at"] - 5
            planted += ["content", "early"]
            break
    # refused: a bad row delivered
    if cell["bad"]:
        deliveries.append({"payload": json.dumps({"u": sorted(cell["bad"])[0]})})
        planted.append("refused")
    # fence, reap, paused: a mark by a stranger, a reap to succeeded, a claim inside a pause
    base = {"seq": 0, "job_id": row["job_id"], "old_worker": "w", "new_worker": None, "old_attempts": 1,
            "new_attempts": 1, "old_lease": 1e12, "at": 1e9, "token": token, "db": row["db"]}
    cell["transitions"] = cell.get("transitions", []) + [
        dict(base, old_state="ready", new_state="running", new_worker="w", actor="a", last_error=None),
        dict(base, old_state="running", new_state="succeeded", actor="stranger", last_error=None),
        dict(base, old_state="running", new_state="succeeded", actor="a", last_error="lease expired (planted)")]
    cell["pauses"] = cell.get("pauses", []) + [(row["db"], 1e9 - 1, 1e9 + 1)]
    planted += ["fence", "reap", "paused"]
    # counts: a figure that disagrees with the table
    cell["counts"] = cell["counts"] + [("planted status", 1, 2)]
    planted.append("counts")
    return planted
