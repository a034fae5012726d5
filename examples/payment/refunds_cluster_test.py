#!/usr/bin/env python3
"""Refunds in the payment cluster, black box: real payment_service nodes on
a PostgreSQL journal they share and Redis placement, the payment_gateway,
all started here on free ports of 127.0.0.1 with data directories of their
own, and stopped at the end. A refund is stored with the payment's
PaymentCancelled in the journal's outbox; every node's outbox dispatcher
claims its share of the stored refunds (leases, FOR UPDATE SKIP LOCKED) and
pays them back through the gateway with the record's idempotency key.

1. No faults: payments through all three nodes' APIs, ~20% of them cancelled
   with a double click each (two cancels at once, through two nodes). Every
   cancel is answered 200 with the refund, and the gateway has made every
   one of those refunds exactly once.
2. kill -9 with refunds claimed and in flight: the gateway is slow and each
   node sends one refund at a time, so the node killed holds refunds it has
   claimed and not finished. The survivors pay every refund asked: the ones
   nobody had claimed at once, the killed node's once its leases run out;
   one the gateway was paying at the kill and is sent again is paid once
   (the gateway answers the repeat from the first).
3. Two single-node services (no [cluster]) on one PostgreSQL journal: their
   dispatchers share the one outbox, and every refund cancelled through
   either node is paid once.

Usage: refunds_cluster_test.py BIN_DIR   (exit 77: no redis-server or PostgreSQL)
proves: A1 (a refund stored with its cancel survives its node's kill -9, is
run by any live node, and is paid once: 0 lost, 0 doubled)
"""

import concurrent.futures
import os
import re
import shutil
import signal
import sys
import tempfile
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_support import (Postgres, Redis, call, check, failures, finish, gateway, get_text,  # noqa: E402
                         payment_node, postgres_bin_dir, wait_until)
from e2e_support import run_test as run  # noqa: E402

BIN = sys.argv[1] if len(sys.argv) > 1 else "build/debug"
LIVENESS_MS = 3000
MARGIN_MS = 500
# Fast and faultless: every settlement is approved, every refund paid.
FAST_GATEWAY = ("--latency-ms", "1", "--decline-rate", "0", "--error-rate", "0", "--hang-rate", "0")


def node_config(work, name, gw_port, pg, schema, redis=None, prefix="", payment=""):
    """A payment node's TOML (as examples/payment/config/cluster-N.toml,
    everything on free ports); clustered when `redis` is given."""
    cluster = f"""[cluster]
redis = "127.0.0.1:{redis.port}"
key_prefix = "{prefix}"
listen_port = 0
heartbeat_ms = 500
liveness_threshold_ms = {LIVENESS_MS}
takeover_margin_ms = {MARGIN_MS}
insecure = true
""" if redis else ""
    return f"""[node]
id = "{name}"
data_dir = "{work}/{name}-data"
[admin]
port = 0
[journal]
backend = "postgres"
postgres = "{pg.conninfo}"
schema = "{schema}"
{cluster}[entities]
shard_count = 16
stop_timeout_ms = 5000
[payment]
port = 0
gateway = "127.0.0.1:{gw_port}"
processing_timeout_ms = 5000
{payment}
"""


def start_cluster(work, procs, tag, gw_port, pg, redis, **cfg):
    """Three clustered nodes, started one after the other, then balanced
    (entity and queue shards): [(Proc, api port, admin port)]."""
    nodes = []
    for i in range(1, 4):
        name = f"{tag}-{i}"
        n = payment_node(BIN, work, name, node_config(work, name, gw_port, pg, tag, redis, tag, **cfg))
        procs.append(n[0])
        nodes.append(n)
    # Until a node has seen the others join, a request it routes to one of
    # them fails (unreachable): wait until each one knows all three.
    members = wait_until(lambda: all(len(call(n[2], "GET", "/cluster")[1]["members"]) == 3 for n in nodes), 30)
    check(members, f"{tag}: the three nodes are members of one cluster, each knowing the others")
    s, r = call(nodes[0][2], "POST", "/rebalance", timeout=60)
    check(s == 200, f"{tag}: the shards are balanced over the nodes ({s}, {r.get('moves') if s == 200 else r})")
    return nodes


def settle_payments(apis, tag, count, threads=24):
    """Creates and settles `count` payments round robin through the APIs;
    the ids of the completed ones, in order."""
    def one(i):
        return call(apis[i % len(apis)], "POST", "/payments",
                    {"customer": f"{tag}-c{i}", "order_id": f"{tag}-{i}", "amount": 1000 + i})
    with concurrent.futures.ThreadPoolExecutor(threads) as ex:
        answers = list(ex.map(one, range(count)))
    completed = [s == 200 and r["status"] == "Completed" for s, r in answers]
    others = [a for a, ok in zip(answers, completed) if not ok]
    check(not others, f"{tag}: {completed.count(True)} of {count} payments settled through {len(apis)} node(s) "
          f"{others[:2]}")
    return [r["id"] for (_, r), ok in zip(answers, completed) if ok]


def cancel(api, pid):
    """A cancel: (status, body)."""
    return call(api, "POST", f"/payments/{pid}/cancel", timeout=30)


def double_click_cancels(apis, tag, pids, threads=24):
    """Cancels each payment twice at once, the two clicks through two
    different nodes. Checks the answers; returns the ids whose refund was
    acknowledged (a 200 Cancelled with the refunded amount)."""
    def clicks(k):
        pid = pids[k]
        with concurrent.futures.ThreadPoolExecutor(2) as ex:
            two = [ex.submit(cancel, apis[(k + j) % len(apis)], pid) for j in range(2)]
            return pid, [f.result() for f in two]
    with concurrent.futures.ThreadPoolExecutor(threads) as ex:
        results = list(ex.map(clicks, range(len(pids))))
    acked, bad, split = [], [], []
    for pid, answers in results:
        ok = [r for s, r in answers if s == 200]
        if any(r["status"] != "Cancelled" or r.get("refunded", 0) <= 0 for r in ok):
            bad.append((pid, answers))
        if len({r["events"] for r in ok}) > 1:
            split.append((pid, answers))
        if ok:
            acked.append(pid)
    check(not bad, f"{tag}: every cancel answered 200 is Cancelled with refunded > 0 {bad[:2]}")
    check(not split, f"{tag}: the two clicks of a double click store one cancel {split[:2]}")
    check(len(acked) == len(pids), f"{tag}: {len(acked)} of {len(pids)} cancels acknowledged with the refund "
          + str([(p, a) for p, a in results if p not in acked][:2]))
    return acked


def gateway_refunds(gw_port):
    s, r = call(gw_port, "GET", "/refunds")
    return r["refunds"] if s == 200 else None


def await_refunds(gw_port, asked, timeout):
    """Polls the gateway until every asked id is refunded or `timeout`;
    then waits until it has nothing in flight. Its /refunds."""
    wait_until(lambda: all(p in gateway_refunds(gw_port) for p in asked), timeout, 0.2)
    wait_until(lambda: call(gw_port, "GET", "/stats")[1]["in_flight"] == 0, 10, 0.1)
    return gateway_refunds(gw_port)


def summary(tag, asked, acked, refunds):
    """Prints the refunds asked (payments cancelled), acknowledged (a cancel
    answered 200 with the refund), made at the gateway, missing (asked
    and never made; of them acknowledged) and made twice. (missing, missing
    acknowledged, twice)."""
    missing = sorted(p for p in asked if p not in refunds)
    lost = [p for p in missing if p in acked]
    twice = sorted(p for p, n in refunds.items() if n > 1)
    print(f"  {tag}: refunds asked {len(asked)}, acknowledged {len(acked)}, at the gateway {sum(refunds.values())} "
          f"({len(refunds)} payments), missing {len(missing)} (acknowledged {len(lost)}), twice {len(twice)}"
          + (f"; missing e.g. {missing[:5]}" if missing else "") + (f"; twice: {twice[:5]}" if twice else ""),
          flush=True)
    return missing, lost, twice


def metric(admin, name):
    """The value of the node's metric `name` (its one series), or None."""
    s, text = get_text(admin, "/metrics")
    if s != 200:
        return None
    m = re.search(r'^' + re.escape(name) + r'\{[^}]*\} (\S+)$', text, re.M)
    return int(float(m.group(1))) if m else None


# --- 1: refunds through every node, no faults ------------------------------------


def test_refunds_through_every_node(work, procs, pg, redis):
    t0 = time.time()
    gw, gw_port = gateway(BIN, work, "t1-gateway", *FAST_GATEWAY)
    procs.append(gw)
    nodes = start_cluster(work, procs, "t1", gw_port, pg, redis)
    apis = [api for _, api, _ in nodes]
    paid = settle_payments(apis, "t1", 90)
    chosen = paid[::5]  # ~20%
    acked = double_click_cancels(apis, "t1", chosen)
    refunds = await_refunds(gw_port, acked, 30)
    missing, _, twice = summary("test 1 (no faults, 3 nodes)", chosen, acked, refunds)
    check(not missing, f"t1: every refund asked reached the gateway (missing {len(missing)})")
    check(not twice, f"t1: none was refunded twice (twice {len(twice)})")
    check(set(refunds) <= set(chosen), "t1: the gateway refunded only the cancelled payments")
    print(f"  test 1 took {time.time() - t0:.1f} s", flush=True)


# --- 2: kill -9 with refunds claimed and in flight ---------------------------------


def test_kill_with_refunds_in_flight(work, procs, pg, redis):
    t0 = time.time()
    # Every refund takes 300 ms at the gateway and each node sends one at a
    # time: the refunds wait in the outbox, and each node has one in flight.
    # A try without an answer for 2 s fails; a claim's lease is 7 s.
    gw, gw_port = gateway(BIN, work, "t2-gateway", "--latency-ms", "300", "--decline-rate", "0", "--error-rate", "0",
                          "--hang-rate", "0", "--io-threads", "2")
    procs.append(gw)
    nodes = start_cluster(work, procs, "t2", gw_port, pg, redis, payment="refund_workers = 1\nrefund_timeout_ms = 2000")
    apis = [api for _, api, _ in nodes]
    victim, survivors = nodes[2], nodes[:2]
    paid = settle_payments(apis, "t2", 60)
    # Through the victim first (each double click's first click), then the others.
    acked = double_click_cancels([victim[1], apis[0], apis[1]], "t2", paid)
    # Killed while it is sending one (its dispatcher claims within a poll).
    in_flight = wait_until(lambda: metric(victim[2], "troupe_outbox_in_flight"), 10, 0.02)
    s, st = call(gw_port, "GET", "/stats")
    victim[0].p.send_signal(signal.SIGKILL)
    killed_at = time.time()
    victim[0].p.wait()
    print(f"  killed {victim[0].p.pid} (kill -9) {killed_at - t0:.1f} s in, with {in_flight} refund(s) in flight; "
          f"the gateway had paid {st['refunds']} of {len(acked)}, {st['in_flight']} in flight", flush=True)
    check(in_flight and in_flight > 0, f"t2: the killed node had a claimed refund in flight ({in_flight})")
    check(st["refunds"] < len(acked), f"t2: refunds were still to be paid at the kill ({st['refunds']} of {len(acked)})")

    bound = (LIVENESS_MS + MARGIN_MS) / 1000 + 15
    gone = wait_until(lambda: all(len(call(n[2], "GET", "/cluster")[1]["members"]) == 2 for n in survivors), bound)
    check(gone, f"t2: the survivors saw the killed node leave ({time.time() - killed_at:.1f} s after the kill)")
    healthy = wait_until(lambda: all(call(n[2], "GET", "/health")[0] == 200 for n in survivors), bound)
    check(healthy, f"t2: the survivors are healthy ({time.time() - killed_at:.1f} s after the kill)")
    refunds = await_refunds(gw_port, acked, 90)
    drained = wait_until(lambda: all(metric(n[2], "troupe_outbox_pending") == 0 for n in survivors), 30)
    refunds = gateway_refunds(gw_port)
    s, st = call(gw_port, "GET", "/stats")
    print(f"  every refund paid {time.time() - killed_at:.1f} s after the kill; outbox empty: {bool(drained)}; "
          f"repeats the gateway answered from their key: {st['refunds_repeated']}", flush=True)
    missing, lost, twice = summary("test 2 (kill -9 of one of 3 nodes)", paid, acked, refunds)
    check(not lost, f"t2: every acknowledged refund reached the gateway after the kill (missing {len(lost)})")
    check(not missing, f"t2: every refund asked reached the gateway (missing {len(missing)})")
    # A refund the killed node had sent runs again on a survivor once its
    # lease is out; the gateway pays its key once.
    check(not twice, f"t2: none was refunded twice (twice {len(twice)})")
    check(set(refunds) <= set(paid), "t2: the gateway refunded only the cancelled payments")
    print(f"  test 2 took {time.time() - t0:.1f} s", flush=True)


# --- 3: two single nodes on one journal share its outbox -------------------------------


def test_two_single_nodes_share_the_outbox(work, procs, pg):
    t0 = time.time()
    gw, gw_port = gateway(BIN, work, "t3-gateway", *FAST_GATEWAY)
    procs.append(gw)
    nodes = {}
    for name in ("t3-a", "t3-b"):  # the same journal (database and schema), no [cluster]
        n = payment_node(BIN, work, name, node_config(work, name, gw_port, pg, "t3"))
        procs.append(n[0])
        nodes[name] = n
    asked, acked = [], set()
    for i in range(20):
        for name, (_, api, _) in nodes.items():
            s, r = call(api, "POST", "/payments", {"customer": f"{name}-c{i}", "order_id": f"{name}-{i}", "amount": 500})
            if s != 200 or r["status"] != "Completed":
                continue
            asked.append(r["id"])
            s, r = call(api, "POST", f"/payments/{r['id']}/cancel", timeout=30)
            if s == 200 and r.get("refunded") == 500:
                acked.add(r["id"])
    check(len(acked) == 40, f"t3: 40 payments settled and cancelled through the two nodes ({len(acked)})")
    refunds = await_refunds(gw_port, acked, 30)
    sent = {name: metric(n[2], "troupe_outbox_sent_total") for name, n in nodes.items()}
    print(f"  refunds each node's dispatcher paid: {sent}", flush=True)
    missing, lost, twice = summary("test 3 (2 single nodes, 1 journal)", asked, acked, refunds)
    check(not missing and not twice, "t3: every refund reached the gateway, once")
    check(sum(v or 0 for v in sent.values()) == len(acked), f"t3: the dispatchers' sent counts add up: {sent}")
    print(f"  test 3 took {time.time() - t0:.1f} s", flush=True)


def main():
    if not shutil.which("redis-server") or not postgres_bin_dir():
        print("skipped: needs redis-server and the PostgreSQL server binaries (scripts/setup-deps)")
        sys.exit(77)
    # ctest's timeout and Ctrl-C: stop everything before going.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    t0 = time.time()
    work = tempfile.mkdtemp(prefix="troupe-refunds-test-")
    pg = redis = None
    try:
        pg = Postgres()
        redis = Redis(work)
        print("== 1: refunds through every node, no faults ==", flush=True)
        run(test_refunds_through_every_node, work, pg, redis)
        print("== 2: kill -9 with refunds claimed and in flight ==", flush=True)
        run(test_kill_with_refunds_in_flight, work, pg, redis)
        print("== 3: two single nodes on one journal share its outbox ==", flush=True)
        run(test_two_single_nodes_share_the_outbox, work, pg)
    finally:
        if redis:
            redis.stop()
        if pg:
            pg.stop()
        if failures:
            print(f"logs kept in {work}", flush=True)
        else:
            shutil.rmtree(work, ignore_errors=True)
    print(f"took {time.time() - t0:.1f} s", flush=True)
    finish()


if __name__ == "__main__":
    main()
