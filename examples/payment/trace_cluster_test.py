#!/usr/bin/env python3
"""A request's trace id across two payment nodes, black box (SPEC X4): two
clustered payment_service nodes on a shared PostgreSQL journal and Redis
placement, the payment_gateway, all on free ports of 127.0.0.1, every node
logging JSON lines at debug to a file of its own.

The nodes talk over mutual TLS (certificates made by scripts/make-certs).
A payment is sent with a known W3C traceparent to node 1's API, with an id
whose shard node 2 owns, so the settlement crosses nodes: node 1 takes the
request and routes the command, node 2's entity stores the events and asks
the gateway. Then:
  - the response carries the trace back in its traceparent header;
  - both nodes logged lines under that trace id, the expected steps among
    them (node 1: the request, the command sent to the owner; node 2: the
    command from node 1, the command handled, the events stored, the
    gateway asked);
  - every line of either node that names the payment carries the trace id;
  - the stored event rows hold it in their trace_id column.
A second request without traceparent, and a third with a malformed one, are
answered 200 with a new trace of their own, which their lines carry.

Usage: trace_cluster_test.py BIN_DIR   (exit 77: no redis-server or PostgreSQL)
proves: X4
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.error
import urllib.request

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_support import (Postgres, Redis, call, check, clean_up, finish, fixed_port_node_config,  # noqa: E402
                         free_port, gateway, make_certs, payment_node, postgres_bin_dir, wait_until)

BIN = sys.argv[1] if len(sys.argv) > 1 else "build/debug"
SHARDS = 4
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE}-00f067aa0ba902b7-01"
FAST_GATEWAY = ("--latency-ms", "1", "--decline-rate", "0", "--error-rate", "0", "--hang-rate", "0")


def node_config(work, name, gw_port, pg, redis, tls_dir):
    """A clustered payment node's TOML, mutual TLS between the nodes, logging
    JSON lines at debug to its own file."""
    return fixed_port_node_config(work, name, api=free_port(), admin=free_port(), peer=free_port(), gw_port=gw_port,
                                  pg=pg, schema="trace", redis=redis, prefix="trace", drain_grace_ms=0,
                                  entity_shards=SHARDS, tls_dir=tls_dir) + f"""[log]
level = "debug"
format = "json"
file = "{work}/{name}.jsonl"
"""


def shard_of(entity_id):
    """troupe::cluster::shard_of: FNV-1a 64 of the id, modulo the shard count."""
    h = 14695981039346656037
    for b in entity_id.encode():
        h = ((h ^ b) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h % SHARDS


def post(port, path, body, traceparent=None):
    """(status, JSON body, response traceparent) of a POST to 127.0.0.1:port."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(), method="POST")
    req.add_header("Content-Type", "application/json")
    if traceparent is not None:
        req.add_header("traceparent", traceparent)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read()), r.headers.get("traceparent")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace"), e.headers.get("traceparent")


def log_lines(path):
    """The JSON lines of a node's log file (anything else is a failure)."""
    out = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                out.append(json.loads(line))
            except ValueError:
                check(False, f"{path}: a line that is not JSON: {line[:200]}")
    return out


def names(line, payment_id):
    """Whether a log line names the payment (in any field)."""
    return any(isinstance(v, str) and re.search(r"(^|\|)" + re.escape(payment_id) + r"$", v)
               for k, v in line.items() if k not in ("msg", "ts"))


def trace_of(traceparent):
    m = re.fullmatch(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})", traceparent or "")
    return m.group(1) if m else None


def stored_traces(pg, payment_id):
    """The trace_id column of the payment's stored events, in order."""
    sql = (f"SELECT coalesce(trace_id, '-') FROM trace.events WHERE persistence_id = "
           f"convert_to('payment|{payment_id}', 'UTF8') ORDER BY seq")
    p = subprocess.run([f"{pg.bin}/psql", "-h", "127.0.0.1", "-p", str(pg.port), "-U", "postgres", "-d", "troupe",
                        "-At", "-c", sql], capture_output=True, text=True, timeout=60)
    check(p.returncode == 0, f"psql reads the events ({p.stderr.strip()})")
    return p.stdout.split()


def test_trace_across_two_nodes(work, procs, pg, redis):
    gw, gw_port = gateway(BIN, work, "gateway", *FAST_GATEWAY)
    procs.append(gw)
    nodes = []
    # The commands cross nodes over mutual TLS, as a real cluster's do.
    tls_dir = make_certs(f"{work}/tls", "pay-1", "pay-2")
    for name in ("pay-1", "pay-2"):
        n = payment_node(BIN, work, name, node_config(work, name, gw_port, pg, redis, tls_dir))
        procs.append(n[0])
        nodes.append((name, *n))
    (n1, _, api1, admin1), (n2, _, _, _) = nodes
    members = wait_until(lambda: all(len(call(a, "GET", "/cluster")[1]["members"]) == 2 for _, _, _, a in nodes), 30)
    check(members, "the two nodes are members of one cluster")
    # Shards are placed when first used: touch every one, then balance.
    for i in range(8 * SHARDS):
        call(api1, "GET", f"/payments/warm-{i}")
    s, r = call(admin1, "POST", "/rebalance", timeout=60)
    check(s == 200, f"the shards are balanced over the two nodes ({s})")

    def owners():
        """The payment shards' owners, as /cluster shows them (refreshed each second)."""
        _, view = call(admin1, "GET", "/cluster")
        return {sh["shard"]: sh["owner"] for sh in view["shards"] or [] if sh["type"] == "payment"}
    placed = wait_until(lambda: (lambda o: o if sorted(set(o.values())) == [n1, n2] else None)(owners()), 30)
    check(placed, f"each node owns payment shards ({owners()})")
    owners = placed or {}
    remote_id = next(f"trace-{i}" for i in range(1000) if owners.get(shard_of(f"trace-{i}")) == n2)
    print(f"  payment {remote_id}: shard {shard_of(remote_id)} on {n2}, sent to {n1}", flush=True)

    s, body, echoed = post(api1, "/payments", {"id": remote_id, "customer": "c1", "order_id": remote_id,
                                               "amount": 1200}, TRACEPARENT)
    check(s == 200 and body.get("status") == "Completed", f"the payment settles through {n1} ({s} {body})")
    check(trace_of(echoed) == TRACE, f"the response carries the request's trace id back ({echoed})")

    # An id of its own for each of the others; a malformed traceparent is
    # ignored, never an error.
    fresh = {}
    for tag, header in (("none", None), ("malformed", "00-not-a-trace-01")):
        other = next(f"trace-{tag}-{i}" for i in range(1000) if owners.get(shard_of(f"trace-{tag}-{i}")) == n2)
        s, body, echoed = post(api1, "/payments", {"id": other, "customer": "c2", "order_id": other, "amount": 1},
                               header)
        t = trace_of(echoed)
        check(s == 200 and t is not None and t != TRACE,
              f"a request with {tag} traceparent is answered 200 under a new trace ({s} {echoed})")
        fresh[other] = t

    # Lines are flushed as they are written; give the last ones a moment.
    time.sleep(0.5)
    logs = {name: log_lines(f"{work}/{name}.jsonl") for name in (n1, n2)}
    for name, lines in logs.items():
        traced = [ln for ln in lines if ln.get("trace_id") == TRACE]
        check(traced, f"{name} logged lines under the request's trace ({len(traced)})")
        check(all(ln.get("node") == name for ln in lines), f"every line of {name} names its node")
        untraced = [ln for ln in lines if names(ln, remote_id) and ln.get("trace_id") != TRACE]
        check(not untraced, f"every line of {name} that names {remote_id} carries its trace id {untraced[:3]}")
        for other, t in fresh.items():
            wrong = [ln for ln in lines if names(ln, other) and ln.get("trace_id") != t]
            check(not wrong, f"every line of {name} that names {other} carries that request's own trace {wrong[:3]}")

    def steps(name):
        return {(ln["component"], ln["msg"]) for ln in logs[name] if ln.get("trace_id") == TRACE}
    want = {
        n1: {("net", "request"), ("app", "settlement requested"), ("cluster", "command sent to the shard's owner"),
             ("app", "settlement answered"), ("net", "response")},
        n2: {("cluster", "command from another node"), ("persist", "command"), ("persist", "events stored"),
             ("app", "asking the gateway to settle")},
    }
    for name, expected in want.items():
        missing = expected - steps(name)
        check(not missing, f"{name} logged each step of the request's path under its trace (missing: {missing})")

    rows = stored_traces(pg, remote_id)
    check(len(rows) >= 2 and all(r == TRACE for r in rows),
          f"the payment's stored events hold the trace id ({rows})")
    for other, t in fresh.items():
        rows = stored_traces(pg, other)
        check(rows and all(r == t for r in rows), f"{other}'s events hold its own trace id ({rows})")


def main():
    if not shutil.which("redis-server") or not postgres_bin_dir():
        print("skipped: needs redis-server and the PostgreSQL server binaries (scripts/setup-deps)")
        sys.exit(77)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    t0 = time.time()
    work = tempfile.mkdtemp(prefix="troupe-trace-test-")
    pg = redis = None
    procs = []
    try:
        pg = Postgres()
        redis = Redis(work)
        test_trace_across_two_nodes(work, procs, pg, redis)
    except Exception as e:  # noqa: BLE001 - a test that raises is a failure
        traceback.print_exc()
        check(False, f"the test raised {type(e).__name__}: {e}")
    finally:
        clean_up(work, procs, redis, pg)
    print(f"took {time.time() - t0:.1f} s", flush=True)
    finish()


if __name__ == "__main__":
    main()
