#!/usr/bin/env python3
"""The payment service's read side over HTTP, black box: a real
payment_service (SQLite journal) and payment_gateway. Payments are created,
settled (approved or declined), cancelled and refunded through the payment
API; GET /customers/{id}/payments and GET /totals/daily must then say
exactly what GET /payments/{id} says of every payment, again after a kill -9
of the service in the middle of traffic and a restart on the same files
(nothing applied twice, nothing missed). Bad ids and dates get 400; the
admin port's /projections and /metrics report every slice's lag.

Usage: read_side_test.py BIN_DIR
Exit 77 (skipped) when the service runs without its read side (a journal
that does not answer queries across entities): it then says why in a 503.
"""

import datetime
import os
import signal
import sys
import tempfile
import threading

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_support import call, check, finish, gateway, get_text, payment_node, wait_until  # noqa: E402

BIN = sys.argv[1] if len(sys.argv) > 1 else "build/debug"
SLICES = 3
CUSTOMERS = [f"cust-{k}" for k in range(4)]


def start_node(work, gw_port):
    return payment_node(BIN, work, "n1", f"""[node]
id = "n1"
data_dir = "{work}/n1-data"
[admin]
port = 0
[entities]
stop_timeout_ms = 2000
[payment]
port = 0
gateway = "127.0.0.1:{gw_port}"
read_slices = {SLICES}
""")


def traffic(api, first, count):
    """Payments first..first+count-1: created only, cancelled before
    settling, settled, or settled and then cancelled (a refund). Stops at
    the first request the service does not answer (it was killed)."""
    try:
        payments(api, first, count)
    except OSError as e:
        print(f"traffic stopped: {e}", flush=True)


def payments(api, first, count):
    for i in range(first, first + count):
        pid = f"rs-{i}"
        body = {"id": pid, "customer": CUSTOMERS[i % 4], "order_id": f"ord-{i}", "amount": 100 + i}
        kind = i % 4
        if kind == 0:
            call(api, "POST", "/payments", {**body, "settle": False})
        elif kind == 1:
            call(api, "POST", "/payments", {**body, "settle": False})
            call(api, "POST", f"/payments/{pid}/cancel")
        else:
            s, r = call(api, "POST", "/payments", body)
            if kind == 3 and s == 200 and r.get("status") == "Completed":
                call(api, "POST", f"/payments/{pid}/cancel")


def truth(api, ids, customers=CUSTOMERS):
    """What the entities say: customer -> {id: row} and the totals."""
    by_customer = {c: {} for c in customers}
    settled = [0, 0]
    refunded = [0, 0]
    for pid in ids:
        s, p = call(api, "GET", f"/payments/{pid}")
        if s != 200:
            continue
        by_customer[p["customer"]][pid] = (p["order_id"], p["amount"], p["status"], p["refunded"])
        if p["status"] == "Completed" or p["refunded"] > 0:
            settled[0] += 1
            settled[1] += p["amount"]
        if p["refunded"] > 0:
            refunded[0] += 1
            refunded[1] += p["refunded"]
    return by_customer, settled, refunded


def read_side(api, customers=CUSTOMERS):
    """What the read side says, in truth()'s shape; None when a route fails
    or a payment is listed twice."""
    by_customer = {}
    for c in customers:
        s, r = call(api, "GET", f"/customers/{c}/payments?limit=1000")
        if s != 200:
            return None
        rows = {p["id"]: (p["order_id"], p["amount"], p["status"], p["refunded"]) for p in r["payments"]}
        if len(rows) != len(r["payments"]):
            return None
        by_customer[c] = rows
    today = datetime.datetime.now(datetime.timezone.utc).date()
    frm, to = today - datetime.timedelta(days=1), today + datetime.timedelta(days=1)
    s, r = call(api, "GET", f"/totals/daily?from={frm}&to={to}")
    if s != 200:
        return None
    settled = [sum(d["settled_count"] for d in r["days"]), sum(d["settled_amount"] for d in r["days"])]
    refunded = [sum(d["refunded_count"] for d in r["days"]), sum(d["refunded_amount"] for d in r["days"])]
    return by_customer, settled, refunded


def matches(api, ids):
    want = truth(api, ids)
    got = read_side(api)
    return (got == want, got, want)


def main():
    work = tempfile.mkdtemp(prefix="troupe-read-side-test-")
    procs = []
    try:
        gw, gw_port = gateway(BIN, work, "gw", "--latency-ms", "1", "--decline-rate", "0.3", "--error-rate", "0",
                              "--hang-rate", "0")
        procs.append(gw)
        n1, api, admin = start_node(work, gw_port)
        procs.append(n1)
        s, r = call(api, "GET", "/customers/nobody/payments")
        if s == 503:
            print(f"skipped: the service runs without its read side: {r}", flush=True)
            sys.exit(77)
        check(s == 200 and r["payments"] == [] and r["customer"] == "nobody",
              f"a customer never seen has an empty list (200): {s} {r}")

        traffic(api, 0, 40)
        ids = [f"rs-{i}" for i in range(40)]
        m = wait_until(lambda: matches(api, ids)[0], 30)
        _, got, want = matches(api, ids)
        check(bool(m), f"every customer's list and the day's totals equal the payments' own status: "
                       f"settled {got and got[1]} vs {want[1]}, refunded {got and got[2]} vs {want[2]}")
        check(want[1][0] > 0 and want[2][0] > 0, f"the traffic settled and refunded some: {want[1]} {want[2]}")

        # The admin port: every slice of both projections, caught up.
        s, p = call(admin, "GET", "/projections")
        keys = sorted(x["key"] for x in p["projections"])
        expect = sorted(f"{n}/tag:payment-slice-{k}" for n in ("payments_by_customer", "daily_totals")
                        for k in range(SLICES))
        check(s == 200 and keys == expect, f"/projections lists every slice: {keys}")
        check(all(x["state"] == "running" and x["failure"] is None for x in p["projections"]),
              "every slice runs")
        _, metrics = get_text(admin, "/metrics")
        lag_lines = [ln for ln in metrics.splitlines() if ln.startswith("troupe_projection_lag_seconds{")]
        check(len(lag_lines) == 2 * SLICES, f"/metrics has a lag per slice: {len(lag_lines)} lines")

        # Bad inputs.
        for path, why in [("/customers/%01x/payments", "a control character"),
                          ("/customers/" + "x" * 129 + "/payments", "an id over 128 bytes"),
                          ("/customers/c/payments?limit=0", "limit 0"),
                          ("/customers/c/payments?limit=abc", "limit not a number"),
                          ("/totals/daily", "no from"),
                          ("/totals/daily?from=2026-13-01", "month 13"),
                          ("/totals/daily?from=2026-02-29", "a day 2026 does not have"),
                          ("/totals/daily?from=2026-03-02&to=2026-03-01", "from after to"),
                          ("/totals/daily?from=2024-01-01&to=2025-12-31", "over 366 days"),
                          ("/totals/daily?from=26-01-01", "a two-digit year")]:
            s, r = call(api, "GET", path)
            check(s == 400 and r["error"]["code"] == "invalid_argument", f"{why}: 400 ({s} {r})")

        # kill -9 in the middle of traffic, then a restart on the same files.
        t = threading.Thread(target=traffic, args=(api, 40, 40))
        t.start()
        wait_until(lambda: call(api, "GET", "/payments/rs-50")[0] == 200, 20)
        n1.stop(signal.SIGKILL)
        t.join()
        procs.remove(n1)
        n1, api, admin = start_node(work, gw_port)
        procs.append(n1)
        traffic(api, 80, 20)
        ids = [f"rs-{i}" for i in range(100)]
        m = wait_until(lambda: matches(api, ids)[0], 30)
        _, got, want = matches(api, ids)
        check(bool(m), f"after kill -9 and a restart the read side still equals the payments: "
                       f"settled {got and got[1]} vs {want[1]}, refunded {got and got[2]} vs {want[2]}")
    finally:
        for p in procs:
            p.stop(signal.SIGKILL)
        os.system(f"rm -rf {work}")
    finish()


if __name__ == "__main__":
    main()
