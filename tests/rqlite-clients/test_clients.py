"""Existing rqlite client libraries, unchanged, against a real tablix daemon.

Usage: python test_clients.py PATH_TO_TABLIX
Starts `tablix up` on an ephemeral 127.0.0.1 port in a temporary data
directory, runs each check, stops the daemon, and prints "N passed, M failed".
"""

import os
import signal
import subprocess
import sys
import tempfile
import traceback

import pyrqlite.dbapi2 as dbapi2
import rqdb


def start(binary, data):
    proc = subprocess.Popen(
        [binary, "up", "--http", "127.0.0.1:0", "--data", data],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "TABLIX_LOG": "warn"},
    )
    line = proc.stdout.readline()
    addr = next(w[len("http=http://"):] for w in line.split() if w.startswith("http=http://"))
    host, port = addr.rsplit(":", 1)
    return proc, host, int(port)


def check_pyrqlite(host, port):
    conn = dbapi2.connect(host=host, port=port)
    with conn.cursor() as c:
        c.execute("CREATE TABLE foo (id INTEGER NOT NULL PRIMARY KEY, name TEXT, n REAL)")
        c.execute("INSERT INTO foo(name, n) VALUES(?, ?)", ("fiona", 1.5))
        assert c.lastrowid == 1, c.lastrowid
        c.executemany("INSERT INTO foo(name) VALUES(?)", seq_of_parameters=(("a",), ("b",)))
        c.execute("SELECT id, name, n FROM foo WHERE name = ?", ("fiona",))
        assert c.fetchall() == [(1, "fiona", 1.5)]
        c.execute("SELECT count(*) FROM foo")
        assert c.fetchone()[0] == 3
        try:
            c.execute("DELETE FROM tablix_meta")
        except Exception as e:  # pyrqlite raises its own Error for statement errors
            assert "system table" in str(e), e
        else:
            raise AssertionError("a write to a system table was accepted")


def check_rqdb(host, port):
    conn = rqdb.connect([f"{host}:{port}"])
    cur = conn.cursor()
    cur.execute("CREATE TABLE bar (id INTEGER PRIMARY KEY, v TEXT)")
    r = cur.execute("INSERT INTO bar(v) VALUES (?)", ("one",))
    assert (r.last_insert_id, r.rows_affected) == (1, 1), (r.last_insert_id, r.rows_affected)
    r = cur.executemany3((("INSERT INTO bar(v) VALUES (?)", ("two",)), ("INSERT INTO bar(v) VALUES (?)", ("three",))))
    assert [(x.last_insert_id, x.rows_affected) for x in r.items] == [(2, 1), (3, 1)]
    r = cur.execute("SELECT v FROM bar ORDER BY id")
    assert r.results == [["one"], ["two"], ["three"]], r.results


def main():
    binary = sys.argv[1]
    passed = failed = 0
    with tempfile.TemporaryDirectory() as data:
        proc, host, port = start(binary, data)
        try:
            for check in (check_pyrqlite, check_rqdb):
                try:
                    check(host, port)
                    passed += 1
                    print(f"ok {check.__name__}")
                except Exception:
                    failed += 1
                    print(f"FAILED {check.__name__}")
                    traceback.print_exc()
        finally:
            proc.send_signal(signal.SIGTERM)
            if proc.wait(timeout=30) != 0:
                failed += 1
                print("FAILED the daemon did not stop cleanly")
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
