#!/usr/bin/env python3
"""Soak client for car-inferenced: C concurrent connections issue N mixed requests in total.

Mix (weights): infer (20), streamed infer (15), stats (12), list (6), health (6), load (12),
invalidate (9) on three models, cancel (10: a streamed infer cancelled after its first token),
disconnect (10: a streamed infer whose connection is closed after its first token, then reopened), and
chat requests with a template in the request (issue #23): chat (8: a conversation rendered with an ordinary
template), chat_hostile (4: a template or a conversation that once crashed the daemon - 10,000-term
operator chains, 30,000-step attribute chains, 60,000 chained filters, a message nested 30,000 deep - each
must be answered bad_request) and chat_cancel (2: a template that would loop for a billion steps, cancelled
while it renders - must be answered cancelled, promptly).
Every reply is checked: an error other than `busy` (or `cancelled` for a request this client cancelled)
counts as an error, as does a reply that does not arrive within --timeout. `stats` replies are checked
against the budget. Prints p50/p99 latency per op and a JSON summary line; exits 1 on any error.
"""
import argparse
import asyncio
import json
import random
import sys
import time

MIX = [("infer", 20), ("infer_stream", 15), ("stats", 12), ("list", 6), ("health", 6), ("load", 12),
       ("invalidate", 9), ("cancel", 10), ("disconnect", 10), ("chat", 8), ("chat_hostile", 4),
       ("chat_cancel", 2)]

CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content | trim }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello world"}]
# Templates that crashed the daemon before issue #23 (their request lines are 20-120 KB).
HOSTILE_TEMPLATES = ["{{ 1" + "+1" * 9999 + " }}", "{{ messages" + ".a" * 30000 + " }}",
                     "{{ messages" + "|e" * 60000 + " }}", "{{ messages" + "[0]" * 20000 + " }}"]
LOOPS = ("{% for a in range(1000) %}{% for b in range(1000) %}{% for c in range(1000) %}{% endfor %}"
         "{% endfor %}{% endfor %}")


class Conn:
    def __init__(self, reader, writer):
        self.r, self.w = reader, writer
        self.next_id = 0

    @classmethod
    async def open(cls, path):
        r, w = await asyncio.open_unix_connection(path, limit=4 << 20)
        return cls(r, w)

    def new_id(self):
        self.next_id += 1
        return self.next_id

    async def send(self, obj):
        await self.send_raw(json.dumps(obj))

    async def send_raw(self, line):
        self.w.write((line + "\n").encode())
        await self.w.drain()

    async def line(self):
        raw = await self.r.readline()
        if not raw:
            raise ConnectionError("daemon closed the connection")
        return json.loads(raw)

    async def final(self, rid):
        """Read until the final (non-event) line of request `rid`; returns (reply, token events seen)."""
        events = 0
        while True:
            j = await self.line()
            if j.get("id") != rid:
                raise RuntimeError(f"reply for unexpected id {j.get('id')!r} while waiting for {rid}")
            if "event" in j:
                events += 1
                continue
            return j, events

    async def close(self):
        self.w.close()
        try:
            await self.w.wait_closed()
        except Exception:
            pass


class Stats:
    def __init__(self):
        self.lat = {}      # op -> [ms]
        self.count = {}
        self.busy = {}
        self.errors = []   # (op, code, message)
        self.max_total = 0
        self.budget = None
        self.over_budget_seen = 0
        self.cancelled = 0

    def ok(self, op, ms):
        self.lat.setdefault(op, []).append(ms)
        self.count[op] = self.count.get(op, 0) + 1

    def error(self, op, code, message):
        self.count[op] = self.count.get(op, 0) + 1
        if code == "busy":
            self.busy[op] = self.busy.get(op, 0) + 1
        else:
            self.errors.append((op, code, message[:300]))


def check(stats, op, reply, allow=()):
    if reply.get("ok"):
        return True
    err = reply.get("error", {})
    code = err.get("code", "?")
    if code in allow:
        return True
    stats.error(op, code, err.get("message", ""))
    return False


def infer_req(rid, model, rng, stream, max_tokens):
    req = {"id": rid, "op": "infer", "model": model, "prompt": rng.choice(PROMPTS), "max_tokens": max_tokens,
           "stream": stream, "ignore_eos": True}
    if rng.random() < 0.5:
        req["temperature"] = 0
    else:
        req.update({"temperature": 0.8, "seed": rng.randrange(1 << 30)})
    return req


PROMPTS = ["Hello world", "The quick brown fox", "Once upon a time", "a", "Soak testing the daemon " * 4]


async def final_replies(conn, n):
    """The next n final replies (token events skipped), by id: a request and its cancel finish in either order."""
    got = {}
    while len(got) < n:
        j = await conn.line()
        if "event" not in j:
            got[j["id"]] = j
    return got


async def client(idx, args, remaining, stats, deadline):
    rng = random.Random(args.seed * 1000 + idx)
    ops, weights = zip(*MIX)
    conn = await Conn.open(args.socket)
    try:
        while remaining[0] > 0 and time.monotonic() < deadline:
            remaining[0] -= 1
            op = rng.choices(ops, weights)[0]
            model = rng.choice(args.models)
            t0 = time.perf_counter()
            try:
                conn = await asyncio.wait_for(one(op, model, conn, rng, stats, args), args.timeout)
            except asyncio.TimeoutError:
                stats.error(op, "timeout", f"no reply within {args.timeout} s")
                await conn.close()
                conn = await Conn.open(args.socket)
            except (ConnectionError, RuntimeError, json.JSONDecodeError) as e:
                stats.error(op, "client", f"{type(e).__name__}: {e}")
                await conn.close()
                conn = await Conn.open(args.socket)
            else:
                stats.lat.setdefault(op, [])
                # one() records errors itself; successful ops get their latency here.
                if getattr(conn, "last_ok", False):
                    stats.ok(op, (time.perf_counter() - t0) * 1000)
    finally:
        await conn.close()


async def one(op, model, conn, rng, stats, args):
    """Run one op; returns the connection to use next (disconnect replaces it)."""
    conn.last_ok = False
    rid = conn.new_id()
    if op in ("stats", "list", "health"):
        await conn.send({"id": rid, "op": op})
        reply, _ = await conn.final(rid)
        if check(stats, op, reply):
            if op == "stats":
                c = reply["result"]["cache"]
                stats.budget = c["budget_bytes"]
                stats.max_total = max(stats.max_total, c["total_bytes"])
                if c.get("over_budget"):
                    stats.over_budget_seen += 1
                if c["total_bytes"] > c["budget_bytes"] and not c.get("over_budget"):
                    stats.error(op, "over_budget", f"total {c['total_bytes']} > budget {c['budget_bytes']}")
                    return conn
            conn.last_ok = True
        return conn
    if op in ("load", "invalidate"):
        await conn.send({"id": rid, "op": op, "model": model})
        reply, _ = await conn.final(rid)
        conn.last_ok = check(stats, op, reply)
        return conn
    if op in ("infer", "infer_stream"):
        stream = op == "infer_stream"
        await conn.send(infer_req(rid, model, rng, stream, args.max_tokens))
        reply, events = await conn.final(rid)
        if check(stats, op, reply):
            n = len(reply["result"]["tokens"])
            if n != args.max_tokens or (stream and events < n):
                stats.error(op, "short", f"{n} tokens, {events} events for max_tokens {args.max_tokens}")
                return conn
            conn.last_ok = True
        return conn
    if op == "cancel":
        await conn.send(infer_req(rid, model, rng, True, args.long_tokens))
        first = await conn.line()
        if first.get("id") != rid:
            raise RuntimeError(f"reply for unexpected id {first.get('id')!r}")
        if "event" not in first:  # finished (or failed, e.g. busy) before any token
            conn.last_ok = check(stats, op, first)
            return conn
        cid = conn.new_id()
        await conn.send({"id": cid, "op": "cancel", "target": rid})
        got = await final_replies(conn, 2)
        ok = check(stats, op, got[cid]) and check(stats, op, got[rid], allow=("cancelled",))
        if ok and got[rid].get("ok") and got[rid]["result"]["finish_reason"] == "cancelled":
            stats.cancelled += 1
        conn.last_ok = ok
        return conn
    if op == "chat":
        await conn.send({"id": rid, "op": "infer", "model": model, "messages": MESSAGES,
                         "chat_template": CHAT_TEMPLATE, "max_tokens": args.max_tokens, "ignore_eos": True,
                         "temperature": 0})
        reply, _ = await conn.final(rid)
        if check(stats, op, reply):
            if reply["result"].get("chat_template") != "request":
                stats.error(op, "chat", f"rendered with {reply['result'].get('chat_template')!r}")
                return conn
            conn.last_ok = True
        return conn
    if op == "chat_hostile":
        if rng.random() < 0.2:
            # A message nested 30,000 deep, written by hand (json.dumps recurses).
            deep = "[" * 30000 + "]" * 30000
            await conn.send_raw(json.dumps({"id": rid, "op": "infer", "model": model, "chat_template": "{{ messages }}",
                                            "messages": [{"role": "user", "content": "X"}]})
                                .replace('"X"', deep))
        else:
            await conn.send({"id": rid, "op": "infer", "model": model, "messages": MESSAGES,
                             "chat_template": rng.choice(HOSTILE_TEMPLATES), "max_tokens": args.max_tokens})
        reply, _ = await conn.final(rid)
        if reply.get("ok"):
            stats.error(op, "accepted", "a hostile chat request was served")
        elif check(stats, op, reply, allow=("bad_request",)):
            conn.last_ok = True
        return conn
    if op == "chat_cancel":
        await conn.send({"id": rid, "op": "infer", "model": model, "messages": MESSAGES, "chat_template": LOOPS,
                         "max_tokens": args.max_tokens})
        await asyncio.sleep(0.05)
        cid = conn.new_id()
        await conn.send({"id": cid, "op": "cancel", "target": rid})
        got = await final_replies(conn, 2)
        if got[rid].get("ok"):
            stats.error(op, "not_cancelled", "a render of a billion steps was not cancelled")
            return conn
        ok = check(stats, op, got[cid]) and check(stats, op, got[rid], allow=("cancelled",))
        if ok and got[rid].get("error", {}).get("code") == "cancelled":
            stats.cancelled += 1
        conn.last_ok = ok
        return conn
    if op == "disconnect":
        await conn.send(infer_req(rid, model, rng, True, args.long_tokens))
        first = await conn.line()
        if "event" not in first:
            conn.last_ok = check(stats, op, first)
            return conn
        await conn.close()  # the daemon must cancel the request and carry on
        fresh = await Conn.open(args.socket)
        fresh.last_ok = True
        return fresh
    raise AssertionError(op)


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100.0 * len(xs)))] if xs else float("nan")


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    ap.add_argument("--models", required=True, help="comma-separated model ids")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--requests", type=int, default=10000, help="in total, over all clients")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--long-tokens", type=int, default=256, help="tokens asked by cancel/disconnect infers")
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("--max-seconds", type=float, default=900, help="stop issuing requests after this long")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    args.models = args.models.split(",")
    stats = Stats()
    remaining = [args.requests]
    t0 = time.monotonic()
    await asyncio.gather(*(client(i, args, remaining, stats, t0 + args.max_seconds) for i in range(args.clients)))
    elapsed = time.monotonic() - t0
    total = sum(stats.count.values())
    print(f"{total} requests from {args.clients} clients in {elapsed:.1f} s ({total / elapsed:.0f}/s); "
          f"{len(stats.errors)} errors, {sum(stats.busy.values())} busy, {stats.cancelled} cancelled")
    print(f"{'op':<14}{'count':>7}{'busy':>6}{'errors':>7}{'p50 ms':>10}{'p99 ms':>10}")
    summary = {"requests": total, "seconds": round(elapsed, 1), "errors": len(stats.errors),
               "busy": sum(stats.busy.values()), "cancelled": stats.cancelled, "max_total_bytes": stats.max_total,
               "budget_bytes": stats.budget, "over_budget_seen": stats.over_budget_seen, "ops": {}}
    for op, _ in MIX:
        lat = stats.lat.get(op, [])
        errs = sum(1 for e in stats.errors if e[0] == op)
        print(f"{op:<14}{stats.count.get(op, 0):>7}{stats.busy.get(op, 0):>6}{errs:>7}"
              f"{pct(lat, 50):>10.2f}{pct(lat, 99):>10.2f}")
        summary["ops"][op] = {"count": stats.count.get(op, 0), "busy": stats.busy.get(op, 0), "errors": errs,
                              "p50_ms": round(pct(lat, 50), 3) if lat else None,
                              "p99_ms": round(pct(lat, 99), 3) if lat else None}
    print(f"cache: max total_bytes seen {stats.max_total} of budget {stats.budget}; "
          f"over_budget (models in use) in {stats.over_budget_seen} stats replies")
    for op, code, msg in stats.errors[:20]:
        print(f"error: {op}: {code}: {msg}", file=sys.stderr)
    print("SUMMARY " + json.dumps(summary))
    return 1 if stats.errors else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
