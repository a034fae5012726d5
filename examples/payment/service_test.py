#!/usr/bin/env python3
"""The payment service over HTTP, black box: the real payment_service and
payment_gateway processes on free ports, driven through the payment API.

Checks the API's flows (create, settle, cancel = refund, get), idempotent
retries, the answers to bad requests, a settlement whose gateway never
answers (it fails as timed out at the processing deadline), back-pressure
(429 once the process manager's bound and buffer are full), a bad config
(exit 1 naming the setting) and a graceful stop on SIGTERM.

Usage: service_test.py BIN_DIR
proves: E1, E3 (the deadline ends a hung settlement), P1 (429 past the
bound), X1 (bad requests get a 4xx with a reason; bad config names the setting),
A1 (a cancelled payment's refund is stored with the cancel before it is
answered, once for a double click, and reaches the gateway once)
"""

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_support import call, check, finish, gateway as start_gateway, payment_node  # noqa: E402

BIN = sys.argv[1] if len(sys.argv) > 1 else "build/debug"


def gateway(work, name, *flags):
    return start_gateway(BIN, work, name, *flags)


def node(work, name, gw_port, extra=""):
    return payment_node(BIN, work, name, f"""[node]
id = "{name}"
data_dir = "{work}/{name}-data"
[admin]
port = 0
[entities]
stop_timeout_ms = 5000
[payment]
port = 0
gateway = "127.0.0.1:{gw_port}"
{extra}
""")


def main():
    work = tempfile.mkdtemp(prefix="troupe-payment-test-")
    procs = []
    try:
        # --- flows against an answering gateway -------------------------------
        gw, gw_port = gateway(work, "gw", "--latency-ms", "1", "--decline-rate", "0", "--error-rate", "0",
                              "--hang-rate", "0")
        procs.append(gw)
        n1, api, admin = node(work, "n1", gw_port)
        procs.append(n1)

        s, r = call(api, "POST", "/payments", {"customer": "c1", "order_id": "o1", "amount": 1250})
        check(s == 200 and r["status"] == "Completed" and r["id"] == "pay-o1" and r["customer"] == "c1",
              f"a payment settles through the gateway: {s} {r}")
        s, again = call(api, "POST", "/payments", {"customer": "c1", "order_id": "o1", "amount": 1250})
        check(s == 200 and again["status"] == "Completed" and again["events"] == r["events"],
              "a retried POST for the same order gets the same outcome and stores nothing")
        s, r = call(api, "POST", "/payments", {"customer": "c1", "order_id": "o1", "amount": 999})
        check(s == 400 and "already used" in r["error"]["message"], f"another amount for the same order is refused: {s}")

        s, r = call(api, "POST", "/payments", {"customer": "c2", "order_id": "o2", "amount": 500, "settle": False})
        check(s == 201 and r["status"] == "WaitingForRequest", f"create without settling: {s} {r}")
        s, r = call(api, "POST", "/payments/pay-o2/settle", {})
        check(s == 200 and r["status"] == "Completed" and r["amount"] == 500, f"settle a created payment: {s} {r}")

        # A user who clicks twice: two cancels at once, one refund.
        answers = []
        clicks = [threading.Thread(target=lambda: answers.append(call(api, "POST", "/payments/pay-o1/cancel")))
                  for _ in range(2)]
        for t in clicks:
            t.start()
        for t in clicks:
            t.join()
        for s, r in answers:
            check(s == 200 and r["status"] == "Cancelled" and r["refunded"] == 1250,
                  f"cancelling a completed payment answers once the refund is stored: {s} {r}")
        check(len({r["events"] for _, r in answers}) == 1, f"a double click stores one cancel: {answers}")
        s, r = call(api, "GET", "/payments/pay-o1")
        check(s == 200 and r["status"] == "Cancelled" and r["refunded"] == 1250, "get shows the refund")
        refunds = {}
        for _ in range(100):
            s, got = call(gw_port, "GET", "/refunds")
            refunds = got.get("refunds", {}) if s == 200 else {}
            if refunds.get("pay-o1", 0) >= 1:
                break
            time.sleep(0.1)
        time.sleep(0.3)
        s, got = call(gw_port, "GET", "/refunds")
        check(s == 200 and got["refunds"].get("pay-o1") == 1,
              f"the refund reached the gateway, once: {got}")

        s, r = call(api, "GET", "/payments/nobody")
        check(s == 404 and r["error"]["code"] == "not_found", f"an unknown payment is 404: {s}")
        s, r = call(api, "POST", "/payments", raw=b"{not json")
        check(s == 400 and "JSON" in r["error"]["message"], f"bad JSON is 400: {s} {r}")
        s, r = call(api, "POST", "/payments", {"customer": "c", "order_id": "o9"})
        check(s == 400 and "positive amount" in r["error"]["message"], f"a missing amount is 400: {s}")
        s, r = call(api, "POST", "/payments", {"customer": "c", "order_id": "o9", "amount": "12"})
        check(s == 400 and "whole number" in r["error"]["message"], f"a string amount is 400: {s}")
        s, r = call(api, "POST", "/payments", {"customer": "c", "order_id": "o9", "amount": -5})
        check(s == 400, f"a negative amount is 400: {s}")
        s, r = call(api, "POST", "/payments/never-created/settle", {})
        check(s == 400 and "was not created" in r["error"]["message"], f"settling an unknown payment is 400: {s}")
        s, r = call(api, "DELETE", "/payments/pay-o1")
        check(s == 405, f"a wrong method is 405: {s}")
        s, r = call(api, "POST", "/payments", {"customer": "c3", "order_id": "o3", "amount": 10})
        check(s == 200 and r["status"] == "Completed", "the service still serves after the bad requests")

        s, e = call(admin, "GET", "/entities/payment/pay-o2")
        check(s == 200 and e["state"]["status"] == "Completed", f"the admin API shows the payment: {s}")

        code = n1.stop(signal.SIGTERM)
        check(code == 0, f"SIGTERM stops the node gracefully (exit {code})")
        with open(n1.log) as f:
            check("stopped" in f.read(), "it says it stopped")

        # --- a gateway that never answers: the processing deadline ends it ------
        hang, hang_port = gateway(work, "hang", "--hang-rate", "1", "--decline-rate", "0", "--error-rate", "0")
        procs.append(hang)
        n2, api2, _ = node(work, "n2", hang_port,
                           "processing_timeout_ms = 400\nmax_settlements = 2\nsettle_buffer = 1\n")
        procs.append(n2)
        t0 = time.time()
        s, r = call(api2, "POST", "/payments", {"customer": "h1", "order_id": "h1", "amount": 7})
        took = time.time() - t0
        check(s == 200 and r["status"] == "Failed" and r["failure"] == "timed out" and 0.35 < took < 5,
              f"a hung settlement fails as timed out at its deadline ({took:.2f} s): {s} {r}")

        # --- back-pressure: 2 running + 1 waiting; the next is refused at once --
        results = []
        def settle(i):
            results.append(call(api2, "POST", "/payments", {"customer": f"b{i}", "order_id": f"b{i}", "amount": 1}))
        threads = [threading.Thread(target=settle, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        time.sleep(0.15)  # the three are in (2 running, 1 buffered)
        t0 = time.time()
        s, r = call(api2, "POST", "/payments", {"customer": "b9", "order_id": "b9", "amount": 1})
        check(s == 429 and r["error"]["code"] == "buffer_overflow" and time.time() - t0 < 0.3,
              f"past the bound the service answers 429 at once: {s} {r}")
        for t in threads:
            t.join()
        check(all(st == 200 and b["failure"] == "timed out" for st, b in results),
              "the admitted ones still end (timed out)")
        n2.stop()

        # --- a bad config ----------------------------------------------------------
        bad = f"{work}/bad.toml"
        with open(bad, "w") as f:
            f.write("[payment]\nport = 0\ngatway = \"x\"\n")
        p = subprocess.run([f"{BIN}/payment_service", "--config", bad], capture_output=True, text=True, timeout=30)
        check(p.returncode == 1 and "payment.gatway: unknown setting" in p.stderr,
              f"a bad config exits 1 naming the setting: {p.returncode} {p.stderr.strip()}")
    finally:
        for p in procs:
            p.stop(signal.SIGKILL)
        subprocess.run(["rm", "-rf", work])
    finish()


if __name__ == "__main__":
    main()
