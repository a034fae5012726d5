#!/usr/bin/env python3
"""A connection flood and slow-loris connections against a real
payment_service's admin port, while a load balancer's probe asks /health.

1,000 connections from 127.0.0.2 (held open, and reopened when the node
closes them) and 100 slow-loris connections from 127.0.0.3 that trickle
header bytes and never finish their request. Meanwhile /health is probed
from 127.0.0.1 on a new connection each time: every probe must be
answered 200 and their p99 must stay within 100 ms. The per-address
limit refuses the flood past its share; request_read_timeout (2 s here)
closes each slow-loris connection with a 408, and the attacker opens
another in its place.

Usage: admin_flood_test.py BIN_DIR
"""

import errno
import multiprocessing
import os
import resource
import selectors
import socket
import sys
import tempfile
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_support import check, clean_up, finish, gateway, payment_node, get_text, wait_until  # noqa: E402

BIN = sys.argv[1] if len(sys.argv) > 1 else "build/debug"
FLOOD = 1000
LORIS = 100
SECONDS = 8


def raise_fd_limit():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def open_from(source, port):
    s = socket.socket()
    s.setblocking(False)
    s.bind((source, 0))
    try:
        s.connect(("127.0.0.1", port))
    except BlockingIOError:
        pass
    return s


class Attack:
    """The flood and the slow-loris connections, in a process of their own
    (not a thread: the probe must not wait for this one's turn at Python's
    lock). Its counts come back through a pipe when it stops."""

    def __init__(self, port):
        self.port = port
        self.stop = multiprocessing.Event()
        self.flood_opened = 0
        self.flood_closed_by_node = 0
        self.loris_closed_by_node = 0
        self.loris_408 = 0
        self.loris_longest = 0.0  # the longest a slow-loris connection stayed open, in seconds
        self.loris_oldest_open = 0.0
        self.results, self._send = multiprocessing.Pipe(duplex=False)
        self.process = multiprocessing.Process(target=self.run, daemon=True)

    def finish(self):
        """Stops the attack; its counts become this object's."""
        self.stop.set()
        counts = self.results.recv() if self.results.poll(30) else {}
        self.process.join(30)
        self.__dict__.update(counts)

    def run(self):
        sel = selectors.DefaultSelector()
        flood = set()
        loris = {}  # socket -> [header bytes still to send, when it was opened]
        next_trickle = 0.0
        while not self.stop.is_set():
            if time.time() >= next_trickle:
                # Those the node closed are replaced on each trickle.
                while len(loris) < LORIS:
                    s = open_from("127.0.0.3", self.port)
                    loris[s] = [b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ", time.time()]
                    sel.register(s, selectors.EVENT_READ, "loris")
            # Up to 200 new ones a round (about 4,000 a second): a flood, but
            # one that leaves this machine's two cores to the node too.
            for _ in range(min(200, FLOOD - len(flood)) if self.flood_opened >= FLOOD else FLOOD):
                try:
                    s = open_from("127.0.0.2", self.port)
                except OSError as e:
                    if e.errno in (errno.EMFILE, errno.EADDRNOTAVAIL):
                        break
                    raise
                flood.add(s)
                self.flood_opened += 1
                sel.register(s, selectors.EVENT_READ, "flood")
            if time.time() >= next_trickle:
                next_trickle = time.time() + 0.5
                for s, state in loris.items():
                    try:
                        s.send(state[0][:1] if state[0] else b"a")
                        state[0] = state[0][1:]
                    except OSError:
                        pass
            for key, _ in sel.select(timeout=0.05):
                s = key.fileobj
                try:
                    data = s.recv(4096)
                except OSError:
                    data = b""
                if key.data == "loris" and data.startswith(b"HTTP/1.1 408"):
                    self.loris_408 += 1
                if not data:
                    sel.unregister(s)
                    s.close()
                    if key.data == "flood":
                        flood.discard(s)
                        self.flood_closed_by_node += 1
                    else:
                        self.loris_longest = max(self.loris_longest, time.time() - loris.pop(s)[1])
                        self.loris_closed_by_node += 1
        now = time.time()
        self.loris_oldest_open = max((now - opened for _, opened in loris.values()), default=0.0)
        for s in list(flood) + list(loris):
            s.close()
        self._send.send({k: v for k, v in self.__dict__.items()
                         if k.startswith(("flood_", "loris_")) and isinstance(v, (int, float))})


def probe(port):
    """Seconds one /health takes on a new connection from 127.0.0.1, or None."""
    start = time.perf_counter()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5, source_address=("127.0.0.1", 0)) as s:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n")
            data = b""
            while True:
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
        if not data.startswith(b"HTTP/1.1 200"):
            return None
        return time.perf_counter() - start
    except OSError:
        return None


# proves: S3
def main():
    limit = raise_fd_limit()
    check(limit >= FLOOD + LORIS + 100, f"this process may open enough sockets (RLIMIT_NOFILE {limit})")
    work = tempfile.mkdtemp(prefix="troupe-admin-flood-")
    procs = []
    try:
        gw, gw_port = gateway(BIN, work, "gw", "--latency-ms", "1", "--decline-rate", "0", "--error-rate", "0",
                              "--hang-rate", "0")
        procs.append(gw)
        node, _, port = payment_node(BIN, work, "n1", f"""[node]
id = "n1"
data_dir = "{work}/n1-data"
[admin]
port = 0
request_read_timeout_ms = 2000
[payment]
port = 0
gateway = "127.0.0.1:{gw_port}"
""")
        procs.append(node)
        check(wait_until(lambda: get_text(port, "/health")[0] == 200, 30), "the node answers /health")

        attack = Attack(port)
        attack.process.start()
        time.sleep(1.0)  # the flood is in place before the probes start
        times, missed = [], 0
        end = time.time() + SECONDS
        while time.time() < end:
            t = probe(port)
            if t is None:
                missed += 1
            else:
                times.append(t)
            time.sleep(0.02)
        attack.finish()

        times.sort()
        p99 = times[min(len(times) - 1, int(len(times) * 0.99))] if times else float("inf")
        print(f"probes: {len(times)} answered, {missed} missed; p50 {times[len(times) // 2] * 1000:.1f} ms, "
              f"p99 {p99 * 1000:.1f} ms, max {times[-1] * 1000:.1f} ms" if times else "no probe answered", flush=True)
        print(f"flood: {attack.flood_opened} connections opened, {attack.flood_closed_by_node} closed by the node; "
              f"slow-loris: {attack.loris_closed_by_node} closed by the node ({attack.loris_408} with 408)",
              flush=True)
        check(len(times) >= 100 and missed == 0, f"every /health probe was answered 200 ({missed} missed)")
        check(p99 <= 0.100, f"/health p99 within 100 ms under the flood ({p99 * 1000:.1f} ms)")
        check(attack.flood_opened >= FLOOD and attack.flood_closed_by_node > 0,
              "the flood opened its connections and the node refused those past its per-address limit")
        check(attack.loris_408 > 0 and attack.loris_closed_by_node >= LORIS,
              f"the node closed the slow-loris connections ({attack.loris_closed_by_node}, {attack.loris_408} with 408)")
        check(attack.loris_longest < 4.0 and attack.loris_oldest_open < 4.0,
              "none trickled on past request_read_timeout (2 s) by much: longest "
              f"{attack.loris_longest:.1f} s, oldest left open {attack.loris_oldest_open:.1f} s")
        s, metrics = get_text(port, "/metrics")
        check(s == 200, f"the node still serves /metrics after the attack: {s}")
        refused = [line for line in metrics.splitlines()
                   if line.startswith("troupe_admin_connections_refused_total") and 'limit="per_address"' in line]
        check(refused and float(refused[0].split()[-1]) > 0,
              f"/metrics counts the connections refused per address: {refused}")
        timeouts = [line for line in metrics.splitlines() if line.startswith("troupe_admin_timeouts_total")]
        check(timeouts and float(timeouts[0].split()[-1]) >= attack.loris_408,
              f"/metrics counts the slow-loris connections cut off: {timeouts}")
        check(node.p.poll() is None, "the node still runs")
    finally:
        clean_up(work, procs)
    finish()


if __name__ == "__main__":
    main()
