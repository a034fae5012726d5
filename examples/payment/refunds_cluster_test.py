#!/usr/bin/env python3
"""Refunds in the payment cluster, black box (issue 22): real payment_service
nodes on a PostgreSQL journal they share and Redis placement, the
payment_gateway, all started here on free ports of 127.0.0.1 with data
directories of their own, and stopped at the end.

1. No faults: payments through all three nodes' APIs, ~20% of them cancelled
   with a double click each (two cancels at once, through two nodes). Every
   cancel answered 200 names its refund job, and the gateway has made every
   one of those refunds exactly once.
2. kill -9 with refunds queued and in flight: the gateway is slow and each
   node runs one refund at a time, so the node killed holds refunds it has
   acknowledged but not paid. After the liveness threshold + takeover margin
   the survivors take its queue shards over and pay every acknowledged
   refund (at least once: one in flight at the kill may be paid twice; the
   count is printed).
3. The misconfiguration is loud: two single-node services (no [cluster]) on
   one PostgreSQL journal each run a durable "refunds" job service writing
   the same log. The one whose append meets the other's reports it:
   /health 503 naming jobs/refunds and journal_conflict,
   troupe_service_up{service="jobs/refunds"} 0, and its cancels are errors,
   not refunds; the other stays healthy.

Usage: refunds_cluster_test.py BIN_DIR   (exit 77: no redis-server or PostgreSQL)
proves: J6 (an acknowledged refund is journaled in a queue shard, survives
its node's kill -9 and is paid by the node taking the shard over; no refund
is lost with the queue shared by the nodes)
"""

import concurrent.futures
import os
import re
import shutil
import signal
import sys
import tempfile
import time
import traceback

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_support import (Postgres, Redis, call, check, failures, finish, gateway, get_text,  # noqa: E402
                         payment_node, postgres_bin_dir, wait_until)

BIN = sys.argv[1] if len(sys.argv) > 1 else "build/debug"
LIVENESS_MS = 3000
MARGIN_MS = 500
# Fast and faultless: every settlement is approved, every refund paid.
FAST_GATEWAY = ("--latency-ms", "1", "--decline-rate", "0", "--error-rate", "0", "--hang-rate", "0")


def node_config(work, name, gw_port, pg, schema, redis=None, prefix="", jobs_shards=6, payment=""):
    """A payment node's TOML (as examples/payment/config/cluster-N.toml,
    everything on free ports); clustered when `redis` is given."""
    cluster = f"""[cluster]
redis = "127.0.0.1:{redis.port}"
key_prefix = "{prefix}"
listen_port = 0
heartbeat_ms = 500
liveness_threshold_ms = {LIVENESS_MS}
takeover_margin_ms = {MARGIN_MS}
[jobs]
shard_count = {jobs_shards}
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


def cancel(api, pid, tries=5):
    """A cancel, sent again while it is answered 503 refund_not_queued (as the
    API asks): (status, body) of the last answer."""
    for _ in range(tries):
        s, r = call(api, "POST", f"/payments/{pid}/cancel", timeout=30)
        if not (s == 503 and isinstance(r, dict) and r.get("error", {}).get("code") == "refund_not_queued"):
            break
        time.sleep(0.2)
    return s, r


def double_click_cancels(apis, tag, pids, threads=24):
    """Cancels each payment twice at once, the two clicks through two
    different nodes. Checks the answers; returns the ids whose refund was
    acknowledged (a 200 naming its refund job)."""
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
        if any(r["status"] != "Cancelled" or not r.get("refund_job") for r in ok):
            bad.append((pid, answers))
        if len({r["refund_job"] for r in ok}) > 1:
            split.append((pid, answers))
        if any(r.get("refund_job") for r in ok):
            acked.append(pid)
    check(not bad, f"{tag}: every cancel answered 200 is Cancelled with refund_job > 0 {bad[:2]}")
    check(not split, f"{tag}: the two clicks of a double click name one refund job {split[:2]}")
    check(len(acked) == len(pids), f"{tag}: {len(acked)} of {len(pids)} cancels acknowledged with a queued refund "
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
    answered 200 with the refund job), made at the gateway, missing (asked
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


def jobs_unfinished(admin):
    """Refund jobs queued or running on a node, from its /metrics."""
    s, text = get_text(admin, "/metrics")
    if s != 200:
        return None
    total = 0
    for m in re.finditer(r'^troupe_jobs_(?:queued|active)\{([^}]*)\} (\S+)$', text, re.M):
        if 'service="refunds"' in m.group(1):
            total += float(m.group(2))
    return int(total)


def service_up(admin, service):
    s, text = get_text(admin, "/metrics")
    m = re.search(r'^troupe_service_up\{[^}]*service="' + re.escape(service) + r'"[^}]*\} (\S+)$', text, re.M)
    return m.group(1) if m else None


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


# --- 2: kill -9 with refunds queued and in flight ----------------------------------


def test_kill_with_refunds_queued(work, procs, pg, redis):
    t0 = time.time()
    # Every refund takes 300 ms at the gateway and each node runs one at a
    # time (one queue shard each, one worker): the refunds queue up.
    gw, gw_port = gateway(BIN, work, "t2-gateway", "--latency-ms", "300", "--decline-rate", "0", "--error-rate", "0",
                          "--hang-rate", "0", "--io-threads", "2")
    procs.append(gw)
    nodes = start_cluster(work, procs, "t2", gw_port, pg, redis, jobs_shards=3, payment="refund_workers = 1")
    apis = [api for _, api, _ in nodes]
    victim, survivors = nodes[2], nodes[:2]
    paid = settle_payments(apis, "t2", 60)
    # Through the victim first (each double click's first click), then the others.
    acked = double_click_cancels([victim[1], apis[0], apis[1]], "t2", paid)
    unfinished = jobs_unfinished(victim[2])
    s, st = call(gw_port, "GET", "/stats")
    victim[0].p.send_signal(signal.SIGKILL)
    killed_at = time.time()
    victim[0].p.wait()
    print(f"  killed {victim[0].p.pid} (kill -9) {killed_at - t0:.1f} s in, holding {unfinished} refund(s) queued "
          f"or running; the gateway had paid {st['refunds']} of {len(acked)}, {st['in_flight']} in flight", flush=True)
    check(unfinished and unfinished > 0, f"t2: the killed node held acknowledged refunds not yet paid ({unfinished})")

    bound = (LIVENESS_MS + MARGIN_MS) / 1000 + 15
    gone = wait_until(lambda: all(len(call(n[2], "GET", "/cluster")[1]["members"]) == 2 for n in survivors), bound)
    check(gone, f"t2: the survivors saw the killed node leave ({time.time() - killed_at:.1f} s after the kill)")
    healthy = wait_until(lambda: all(call(n[2], "GET", "/health")[0] == 200 for n in survivors), bound)
    check(healthy, f"t2: the survivors run every queue shard, healthy ({time.time() - killed_at:.1f} s after the kill)")
    refunds = await_refunds(gw_port, acked, 90)
    drained = wait_until(lambda: all(jobs_unfinished(n[2]) == 0 for n in survivors), 30)
    refunds = gateway_refunds(gw_port)
    print(f"  every refund paid {time.time() - killed_at:.1f} s after the kill; queues drained: {bool(drained)}",
          flush=True)
    missing, lost, twice = summary("test 2 (kill -9 of one of 3 nodes)", paid, acked, refunds)
    check(not lost, f"t2: every acknowledged refund reached the gateway after the kill (missing {len(lost)})")
    check(not missing, f"t2: every refund asked reached the gateway (missing {len(missing)})")
    # At least once: a refund running at the kill (sent to the gateway, its
    # outcome not yet journaled) runs again on the shard's new owner.
    print(f"  refunded twice (running at the kill, run again by the new owner): {len(twice)}", flush=True)
    check(set(refunds) <= set(paid), "t2: the gateway refunded only the cancelled payments")
    print(f"  test 2 took {time.time() - t0:.1f} s", flush=True)


# --- 3: one durable job service per node on a shared journal is loud -----------------


def test_shared_journal_without_cluster_is_loud(work, procs, pg):
    t0 = time.time()
    gw, gw_port = gateway(BIN, work, "t3-gateway", *FAST_GATEWAY)
    procs.append(gw)
    nodes = {}
    for name in ("t3-a", "t3-b"):  # the same journal (database and schema), no [cluster]
        n = payment_node(BIN, work, name, node_config(work, name, gw_port, pg, "t3"))
        procs.append(n[0])
        nodes[name] = n
    asked = {name: [] for name in nodes}  # payments cancelled through each node
    acked = set()
    answers = {name: [] for name in nodes}

    def health(name):
        return call(nodes[name][2], "GET", "/health")

    def refund_through(name, i):
        """Settles a payment through node `name` and cancels it there: the
        cancel's (status, body)."""
        api = nodes[name][1]
        s, r = call(api, "POST", "/payments", {"customer": f"{name}-c{i}", "order_id": f"{name}-{i}", "amount": 500})
        if s != 200 or r["status"] != "Completed":
            return None, (s, r)
        asked[name].append(r["id"])
        s, r = call(api, "POST", f"/payments/{r['id']}/cancel", timeout=30)
        if s == 200 and r.get("refund_job"):
            acked.add(r["id"])
        answers[name].append(s)
        return s, r

    sick = []
    for i in range(20):
        for name in nodes:
            refund_through(name, i)
        sick = [name for name in nodes if health(name)[0] != 200]
        if sick:
            break
    check(len(sick) == 1, f"t3: one node's refund queue met the other's appends (unhealthy: {sick}, after "
          f"{sum(len(a) for a in asked.values())} cancels)")
    if len(sick) != 1:
        return
    bad = sick[0]
    good = next(n for n in nodes if n != bad)
    s, h = health(bad)
    svc = h.get("services", {}).get("jobs/refunds", {}) if isinstance(h, dict) else {}
    check(s == 503 and h["status"] == "unhealthy" and svc.get("up") is False and svc.get("code") == "journal_conflict",
          f"t3: {bad}'s /health is 503 naming jobs/refunds and journal_conflict: {s} {h}")
    up = service_up(nodes[bad][2], "jobs/refunds")
    check(up == "0", f't3: {bad}\'s /metrics has troupe_service_up{{service="jobs/refunds"}} 0 (got {up})')
    s, r = refund_through(bad, 100)
    check(s is not None and s != 200 and not (isinstance(r, dict) and r.get("refund_job")),
          f"t3: a cancel through {bad} is an error, not a refund: {s} {r}")

    s, h = health(good)
    check(s == 200 and h["services"]["jobs/refunds"]["up"] is True, f"t3: {good} stays healthy: {s} {h}")
    up = service_up(nodes[good][2], "jobs/refunds")
    check(up == "1", f't3: {good}\'s troupe_service_up{{service="jobs/refunds"}} is 1 (got {up})')
    s, r = refund_through(good, 100)
    check(s == 200 and r["refund_job"] > 0, f"t3: a cancel through {good} still queues its refund: {s} {r}")
    refunds = await_refunds(gw_port, acked, 30)
    _, lost, twice = summary("test 3 (2 single nodes, 1 journal)", asked[good] + asked[bad], acked, refunds)
    check(not lost and not twice, "t3: the acknowledged refunds reached the gateway, once")
    print(f"  cancels through {good} (healthy) answered {answers[good]}; through {bad} (journal_conflict) "
          f"{answers[bad]}", flush=True)
    print(f"  test 3 took {time.time() - t0:.1f} s", flush=True)


def run(test, *args):
    """Runs one test; whatever it started is killed when it ends, pass or fail."""
    work, *servers = args
    procs = []
    try:
        test(work, procs, *servers)
    except Exception as e:  # noqa: BLE001 - a test that raises is a failure, and the next one still runs
        traceback.print_exc()
        check(False, f"{test.__name__} raised {type(e).__name__}: {e}")
    finally:
        for p in procs:
            p.stop(signal.SIGKILL)


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
        print("== 2: kill -9 with refunds queued and in flight ==", flush=True)
        run(test_kill_with_refunds_queued, work, pg, redis)
        print("== 3: two single nodes on one journal: the refund queue's conflict is loud ==", flush=True)
        run(test_shared_journal_without_cluster_is_loud, work, pg)
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
