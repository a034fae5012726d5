#!/usr/bin/env python3
"""Payments created and never settled expire in the payment cluster, black
box: three payment_service nodes on one PostgreSQL journal and Redis
placement (as refunds_cluster_test.py starts them), [payment] expire_after
= "3s". Every node runs the payments' reminder service on the one reminders
table in the journal's schema; a service claims what it takes, so each
firing is taken by one node, which asks the payment Expire through the
cluster (the payment's owner may be another node).

Payments are created without settling through all three nodes' APIs, and
a third of them settled at once through another node. Then every unsettled
one is Cancelled with detail "expired", refunded 0, and exactly one
PaymentCancelled (two events: created, cancelled); every settled one stays
Completed; and the three nodes' payment_expiry_delivered_total add up to
the number of unsettled payments (each firing delivered once, by one node).

Usage: expiry_cluster_test.py BIN_DIR   (exit 77: no redis-server or PostgreSQL)
proves: R2 (reminders on a store shared by several services: each firing is
delivered by one of them)
"""

import concurrent.futures
import os
import re
import sys
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_support import call, check, gateway, get_text, run_cluster_tests, wait_until  # noqa: E402
from refunds_cluster_test import FAST_GATEWAY, start_cluster  # noqa: E402

BIN = sys.argv[1] if len(sys.argv) > 1 else "build/debug"
COUNT = 60  # every third one settled
EXPIRY = 'expire_after = "3s"\nexpire_rate = 200'


def status(api, pid):
    s, r = call(api, "GET", f"/payments/{pid}")
    return r if s == 200 else {}


def delivered(admin):
    """payment_expiry_delivered_total of one node."""
    _, text = get_text(admin, "/metrics")
    m = re.search(r"^payment_expiry_delivered_total (\S+)$", text, re.M)
    return int(float(m.group(1))) if m else -1


def test_unsettled_payments_expire_once_across_the_cluster(work, procs, pg, redis):
    t0 = time.time()
    gw, gw_port = gateway(BIN, work, "ex-gateway", *FAST_GATEWAY)
    procs.append(gw)
    nodes = start_cluster(work, procs, "ex", gw_port, pg, redis, payment=EXPIRY)
    apis = [api for _, api, _ in nodes]
    print(f"  the cluster took {time.time() - t0:.1f} s to start", flush=True)

    def one(i):
        pid = f"ex-{i}"
        s, r = call(apis[i % 3], "POST", "/payments",
                    {"id": pid, "customer": f"ex-c{i % 5}", "order_id": f"o-{i}", "amount": 500 + i, "settle": False})
        if s != 201:
            return pid, f"create answered {s} {r}"
        if i % 3 == 0:
            s, r = call(apis[(i + 1) % 3], "POST", f"/payments/{pid}/settle", {})
            if s != 200 or r.get("status") != "Completed":
                return pid, f"settle answered {s} {r}"
        return pid, ""

    with concurrent.futures.ThreadPoolExecutor(12) as ex:
        made = list(ex.map(one, range(COUNT)))
    created_at = time.time()
    bad = [m for m in made if m[1]]
    check(not bad, f"{COUNT} payments created through three nodes, every third settled at once {bad[:2]}")
    unsettled = [f"ex-{i}" for i in range(COUNT) if i % 3 != 0]
    settled = [f"ex-{i}" for i in range(COUNT) if i % 3 == 0]

    def expired(pid, api):
        return status(api, pid).get("detail") == "expired"
    done = wait_until(lambda: all(expired(pid, apis[k % 3]) for k, pid in enumerate(unsettled)), 30, 0.5)
    check(bool(done), f"the {len(unsettled)} unsettled payments expired "
                      f"({time.time() - created_at:.1f} s after they were created)")
    wrong = []
    for k, pid in enumerate(unsettled):
        st = status(apis[(k + 1) % 3], pid)
        if st.get("status") != "Cancelled" or st.get("detail") != "expired" or st.get("refunded") != 0 \
                or st.get("events") != 2:
            wrong.append((pid, st))
    check(not wrong, f"each is Cancelled, detail \"expired\", refunded 0, with one PaymentCancelled "
                     f"(2 events) {wrong[:2]}")

    time.sleep(1.5)  # past the settled ones' due times too
    kept = [(pid, status(apis[0], pid)) for pid in settled]
    off = [(pid, st) for pid, st in kept if st.get("status") != "Completed" or st.get("detail") == "expired"]
    check(not off, f"the {len(settled)} settled payments did not expire {off[:2]}")

    counts = [delivered(admin) for _, _, admin in nodes]
    check(sum(counts) == len(unsettled),
          f"payment_expiry_delivered_total over the nodes adds up to {len(unsettled)}: one delivery per "
          f"firing (per node {counts})")
    print(f"  took {time.time() - t0:.1f} s", flush=True)


def main():
    run_cluster_tests("troupe-expiry-cluster-test-", test_unsettled_payments_expire_once_across_the_cluster)


if __name__ == "__main__":
    main()
