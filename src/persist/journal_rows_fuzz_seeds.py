#!/usr/bin/env python3
"""Writes the seed corpus of journal_rows_fuzz (src/persist/journal_rows_fuzz.cpp).

Each seed is the rows one of the journals really stores for a small
entity, in the input layout that file describes: events of a counter
("Deposited" v1, a ByteWriter u64 amount), a snapshot, a deletion mark, a
fence, the result sets PostgreSQL's statements return for them
(pg_support.cpp, Sql), and the events of a durable job service
(src/patterns/job_journal.cpp, doc/jobs.md "Journal format").
Inputs a fuzz run once failed on are kept beside these seeds, under
names of their own. Usage: journal_rows_fuzz_seeds.py <dir>.
"""
import struct
import sys
from pathlib import Path

RECOVER, REPLAY, HIGHEST, SNAPSHOT, FENCE = range(5)
EVENTS, SNAPSHOTS, DELETIONS, FENCES = range(4)


def head(postgres, read, lo=0, hi=255):
    return bytes([(read << 2) | (1 if postgres else 0), lo, hi])


# --- the durable job service: events as job_journal.cpp encodes them ------------
def bw_str(b):
    b = b.encode() if isinstance(b, str) else b
    return struct.pack("<I", len(b)) + b


def accepted(*jobs):  # (id, priority, timeout_ns, kind, payload)
    out = struct.pack("<I", len(jobs))
    for id_, prio, timeout, kind, payload in jobs:
        out += struct.pack("<Qqq", id_, prio, timeout) + bw_str(kind) + bw_str(payload)
    return out


def finished(*outcomes):  # (id, tag, text)
    out = struct.pack("<I", len(outcomes))
    for id_, tag, text in outcomes:
        out += struct.pack("<QB", id_, tag) + bw_str(text)
    return out


def job_event(kind, payload, version=1):
    return bytes([kind, version]) + struct.pack(">H", len(payload)) + payload


def job_head(first_seq=0, extra_highest=0):
    return bytes([2, first_seq, extra_highest])


# --- SQLite: typed values --------------------------------------------------------
def null():
    return bytes([0])


def integer(v):
    return bytes([1]) + struct.pack("<q", v)


def text(s):
    b = s.encode()
    return bytes([2, len(b)]) + b


def blob(b):
    return bytes([3, len(b)]) + b


def real(d):
    return bytes([4]) + struct.pack("<d", d)


def row(table, *values, other_id=False):
    return bytes([table | (0x80 if other_id else 0)]) + b"".join(values)


def event(seq, amount, ts=1_764_200_000_000 , other_id=False):
    return row(EVENTS, integer(seq), integer(ts + seq), text("Deposited"), integer(1),
               blob(struct.pack("<Q", amount)), other_id=other_id)


def snapshot(seq, balance):
    return row(SNAPSHOTS, integer(seq), integer(1_764_200_000_000 + seq), text("Balance"), integer(1),
               blob(struct.pack("<q", balance)))


# --- PostgreSQL: a result set ----------------------------------------------------
INT8, BYTEA, TEXT, UNKNOWN = range(4)


def pg_result(oids, rows):
    out = bytes([len(oids)]) + bytes(oids)
    for r in rows:
        for cell in r:
            if cell is None:
                out += bytes([0])
            elif isinstance(cell, int):
                out += bytes([1]) + struct.pack(">q", cell)
            else:
                out += bytes([2, len(cell)]) + cell
    return out


RECORD = [INT8, INT8, INT8, BYTEA, INT8, BYTEA]  # kind, seq, timestamp_ms, type, version, payload


def pg_event(seq, amount, kind=2):
    return [kind, seq, 1_764_200_000_000 + seq, b"Deposited", 1, struct.pack("<Q", amount)]


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    seeds = {
        "sqlite_recover_events": head(False, RECOVER) + event(1, 5) + event(2, 7) + event(3, 1),
        "sqlite_recover_snapshot": head(False, RECOVER) + snapshot(2, 12) + event(1, 5) + event(2, 7) + event(3, 1),
        "sqlite_recover_deleted": head(False, RECOVER) + snapshot(2, 12) + row(DELETIONS, integer(2)) + event(3, 1),
        "sqlite_recover_hole": head(False, RECOVER) + event(1, 5) + event(3, 1),
        "sqlite_recover_two_ids": head(False, RECOVER) + event(1, 5) + event(1, 9, other_id=True),
        "sqlite_recover_bad_types": head(False, RECOVER)
        + row(EVENTS, text("1"), real(2.5), blob(b"Deposited"), integer(-1), text("x")),
        "sqlite_replay_range": head(False, REPLAY, 2, 3) + event(1, 5) + event(2, 7) + event(3, 1) + event(4, 2),
        "sqlite_highest": head(False, HIGHEST) + event(1, 5) + row(DELETIONS, integer(9)),
        "sqlite_highest_negative": head(False, HIGHEST) + row(DELETIONS, integer(-3)),
        "sqlite_snapshot": head(False, SNAPSHOT) + snapshot(4, 40) + snapshot(7, 70),
        "sqlite_snapshot_null_payload": head(False, SNAPSHOT)
        + row(SNAPSHOTS, integer(4), null(), text("Balance"), integer(1), null()),
        "sqlite_fences": head(False, FENCE) + row(FENCES, integer(3)) + row(FENCES, integer(8), other_id=True),
        "sqlite_fence_text": head(False, FENCE) + row(FENCES, text("seven")),
        "pg_recover": head(True, RECOVER)
        + pg_result(RECORD, [[0, 2, 1_764_200_000_002, b"Balance", 1, struct.pack("<q", 12)],
                             [1, 3, None, None, 0, None], pg_event(3, 1)]),
        "pg_recover_no_snapshot": head(True, RECOVER)
        + pg_result(RECORD, [[1, 2, None, None, 0, None], pg_event(1, 5), pg_event(2, 7)]),
        "pg_recover_deleted": head(True, RECOVER)
        + pg_result(RECORD, [[1, 5, None, None, 3, None], pg_event(4, 1), pg_event(5, 2)]),
        "pg_replay": head(True, REPLAY, 1, 255)
        + pg_result(RECORD, [[1, 0, None, None, 0, None], pg_event(1, 5), pg_event(2, 7)]),
        "pg_highest": head(True, HIGHEST) + pg_result([INT8, INT8], [[7, None]]),
        "pg_snapshot": head(True, SNAPSHOT)
        + pg_result(RECORD[1:], [[2, 1_764_200_000_002, b"Balance", 1, struct.pack("<q", 12)]]),
        "pg_highest_fence": head(True, FENCE) + pg_result([INT8], [[4]]),
        "pg_wrong_types": head(True, RECOVER) + pg_result([TEXT, UNKNOWN, INT8], [[b"0", b"x", 1]]),
        "jobs_open": job_head() + job_event(0, accepted((1, 0, 30_000_000_000, "email.send", b'{"to":"a@b"}'),
                                                         (2, 5, 0, "report", b"")))
        + job_event(1, finished((1, 0, "sent"))),
        "jobs_all_done": job_head(4, 1) + job_event(0, accepted((7, -1, 1_000_000, "noop", b"x")))
        + job_event(1, finished((7, 2, ""), (6, 1, "compacted away"))),
        "jobs_unknown_type": job_head() + bytes([2, 1, 0, 3]) + b"job.other" + b"abc",
        "jobs_bad_version": job_head() + job_event(0, accepted((1, 0, 0, "k", b"")), version=2),
        "jobs_last_id": job_head() + job_event(0, accepted((1, 0, 0, "k", b"")))
        + job_event(1, finished((2**64 - 1, 0, "x"))),
        "jobs_twice": job_head() + job_event(0, accepted((3, 0, 0, "k", b""), (3, 0, 0, "k", b""))),
    }
    for name, data in seeds.items():
        (out / name).write_bytes(data)


if __name__ == "__main__":
    main()
