#!/usr/bin/env python3
"""Writes the seed corpus of placement_values_fuzz (placement_values_fuzz.cpp).

Each seed is a byte picking the parser, then what that parser reads in
production: desired sets as doc/redis.md shows them, the HTTP answers
of a desired-set server, URLs, and the replies of the placement scripts
(scripts.cpp) in RESP as Redis sends them: an assignment
[owner, epoch, updated_ms, spec, handing_off_from, handoff_epoch] and a
heartbeat's member view [id, age_ms, "<since> <session> <host> <port>", ...].
Inputs a fuzz run once failed on are kept beside these seeds, under
names of their own. Usage: placement_fuzz_seeds.py <dir>.
"""
import sys
from pathlib import Path

DESIRED, HTTP, URL, ASSIGNMENT, MEMBERS, VALUES = range(6)


def resp(v):
    if v is None:
        return b"$-1\r\n"
    if isinstance(v, int):
        return b":%d\r\n" % v
    if isinstance(v, list):
        return b"*%d\r\n" % len(v) + b"".join(resp(x) for x in v)
    b = v.encode() if isinstance(v, str) else v
    return b"$%d\r\n%s\r\n" % (len(b), b)


UNITS = b"# unit  spec\nbilling-eu   {\"region\":\"eu\"}\nbilling-us   {\"region\":\"us\"}\n\nreports\n"


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    seeds = {
        "desired_set": bytes([DESIRED]) + UNITS,
        "desired_set_twice": bytes([DESIRED]) + b"a 1\r\nb\t2\na 3\n",
        "desired_set_control": bytes([DESIRED]) + b"ok x\nbad\x01unit y\n",
        "http_length": bytes([HTTP]) + b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n"
        % len(UNITS) + UNITS,
        "http_chunked": bytes([HTTP]) + b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"1a;ext=1\r\n" + UNITS[:26] + b"\r\n%x\r\n" % (len(UNITS) - 26) + UNITS[26:] + b"\r\n0\r\n\r\n",
        "http_close": bytes([HTTP]) + b"HTTP/1.0 200 OK\r\nServer: x\r\n\r\n" + UNITS,
        "http_404": bytes([HTTP]) + b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n",
        "http_short": bytes([HTTP]) + b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\nunit spec\n",
        "url": bytes([URL]) + b"http://placement.internal:8080/groups/billing/units",
        "url_v6": bytes([URL]) + b"http://[::1]:9000/units",
        "url_bad_port": bytes([URL]) + b"http://host:99999/",
        "assignment": bytes([ASSIGNMENT]) + resp(["node-1", 7, 1764200000000, '{"region":"eu"}', "", 0]),
        "assignment_handoff": bytes([ASSIGNMENT]) + resp(["node-2", "8", "1764200000123", "spec", "node-1", "7"]),
        "assignment_nil": bytes([ASSIGNMENT]) + resp(["node-1", None, 1, "", "", 0]),
        "members": bytes([MEMBERS]) + resp(["node-1", 120, "1764200000000 9f2c1a 127.0.0.1 7101",
                                            "node-2", "2500", "1764200001000 77ab01 10.0.0.2 7102",
                                            "node-3", 9000, "1764190000000 0001 10.0.0.3 7103"]),
        "members_bad": bytes([MEMBERS]) + resp(["bad id", 1, "1 2 h 1", "node-4", 1, "1 2 h 0",
                                                "node-5", 1, "too few words"]),
        "values": bytes([VALUES]) + resp(["OK", 3, "sync billing", "moved  billing  unit-7", None, [1, "x"]]),
        "values_error": bytes([VALUES]) + b"-NOSCRIPT No matching script\r\n",
        "values_status": bytes([VALUES]) + b"+OK\r\n",
    }
    for name, data in seeds.items():
        (out / name).write_bytes(data)


if __name__ == "__main__":
    main()
