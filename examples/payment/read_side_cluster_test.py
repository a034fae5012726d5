#!/usr/bin/env python3
"""The read side in the payment cluster, black box: three payment_service
nodes on one PostgreSQL journal and Redis placement (as refunds_cluster_test.py
starts them), the read models in the journal's schema, each slice of each
projection run by one node (Node::serve_projection).

1. Payments through all three nodes, some cancelled with a refund. Then on
   every node GET /customers/{id}/payments equals what GET /payments/{id}
   says of each payment (none missing, none twice, same status and refund),
   and the days' totals add up; /projections on the three nodes together
   list every slice of both projections exactly once.
2. kill -9 of one node in the middle of more traffic: its slices move to
   the survivors, and on both survivors the lists again equal the
   payments' own states, the totals too (nothing applied twice).

Usage: read_side_cluster_test.py BIN_DIR   (exit 77: no redis-server or PostgreSQL)
"""

import concurrent.futures
import os
import signal
import sys
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_support import call, check, gateway, run_cluster_tests, wait_until  # noqa: E402
from read_side_test import read_side, truth  # noqa: E402
from refunds_cluster_test import LIVENESS_MS, MARGIN_MS, start_cluster  # noqa: E402

BIN = sys.argv[1] if len(sys.argv) > 1 else "build/debug"
SLICES = 4  # the default [payment] read_slices
CUSTOMERS = [f"rc-c{k}" for k in range(6)]
KEYS = sorted(f"{n}/tag:payment-slice-{k}" for n in ("payments_by_customer", "daily_totals") for k in range(SLICES))


def traffic(apis, first, count, threads=12):
    """Payments first..first+count-1 round robin through `apis`: settled, and
    every third one cancelled after (a refund). Requests a dead node does not
    answer are left; the ids of the payments created."""
    def one(i):
        api = apis[i % len(apis)]
        pid = f"rc-{i}"
        try:
            s, r = call(api, "POST", "/payments", {"id": pid, "customer": CUSTOMERS[i % len(CUSTOMERS)],
                                                   "order_id": f"o-{i}", "amount": 100 + i})
            if s == 200 and i % 3 == 0 and r.get("status") == "Completed":
                call(api, "POST", f"/payments/{pid}/cancel", timeout=30)
        except OSError:
            pass  # a node killed
        return pid
    with concurrent.futures.ThreadPoolExecutor(threads) as ex:
        return list(ex.map(one, range(first, first + count)))


def expect_equal(tag, nodes, ids, timeout=40):
    """Every node's read side equals the payments' own states (asked of the
    first node again each time: a payment recovered after a kill may still
    be settling) within `timeout`."""
    for _, api, _ in nodes:
        ok = wait_until(lambda: read_side(api, CUSTOMERS) == truth(nodes[0][1], ids, CUSTOMERS), timeout, 0.5)
        want = truth(nodes[0][1], ids, CUSTOMERS)
        got = read_side(api, CUSTOMERS)
        diff = [] if got is None else [(c, sorted(set(want[0][c].items()) ^ set(got[0][c].items()))[:2])
                                       for c in CUSTOMERS if got[0][c] != want[0][c]]
        check(bool(ok), f"{tag}: node :{api}'s lists and totals equal the {len(ids)} payments' states "
                        f"(settled {got and got[1]} vs {want[1]}, refunded {got and got[2]} vs {want[2]}, "
                        f"differing {diff[:2]})")
    return want


def slice_owners(nodes):
    """The slices the nodes run: [key] over all of them (a key twice: two owners)."""
    keys = []
    for _, _, admin in nodes:
        s, p = call(admin, "GET", "/projections")
        keys += [x["key"] for x in p["projections"]] if s == 200 else []
    return sorted(keys)


def test_read_side_across_the_cluster(work, procs, pg, redis):
    t0 = time.time()
    gw, gw_port = gateway(BIN, work, "rs-gateway", "--latency-ms", "1", "--decline-rate", "0.2", "--error-rate", "0",
                          "--hang-rate", "0")
    procs.append(gw)
    nodes = start_cluster(work, procs, "rs", gw_port, pg, redis)
    apis = [api for _, api, _ in nodes]
    placed = wait_until(lambda: slice_owners(nodes) == KEYS, 30)
    check(bool(placed), f"every slice of both projections runs on exactly one node: {slice_owners(nodes)}")
    ids = traffic(apis, 0, 90)
    want = expect_equal("1", nodes, ids)
    check(want[1][0] > 0 and want[2][0] > 0, f"the traffic settled and refunded some: {want[1]} {want[2]}")
    print(f"  test 1 took {time.time() - t0:.1f} s", flush=True)

    # kill -9 of the node running slices, in the middle of traffic.
    victim, survivors = nodes[2], nodes[:2]
    with concurrent.futures.ThreadPoolExecutor(1) as ex:
        more = ex.submit(traffic, apis, 90, 60)
        wait_until(lambda: call(apis[0], "GET", "/payments/rc-110")[0] == 200, 20)
        victim[0].p.send_signal(signal.SIGKILL)
        killed_at = time.time()
        victim[0].p.wait()
        more.result()
    bound = (LIVENESS_MS + MARGIN_MS) / 1000 + 20
    moved = wait_until(lambda: slice_owners(survivors) == KEYS, bound)
    check(bool(moved), f"2: the killed node's slices run on the survivors, one owner each "
                       f"({time.time() - killed_at:.1f} s after the kill): {slice_owners(survivors)}")
    ids = [f"rc-{i}" for i in range(150)]
    expect_equal("2 (after kill -9)", survivors, ids, timeout=60)
    print(f"  test 2 took {time.time() - killed_at:.1f} s after the kill", flush=True)


def main():
    run_cluster_tests("troupe-read-side-cluster-test-", test_read_side_across_the_cluster)


if __name__ == "__main__":
    main()
