"""The one SQLite storage helper (`kgrag_nb.store`, issue 24): WAL, busy timeout, atomic writes, one retry when locked.

Every cache of the package (LLM responses, embeddings, SPARQL results) goes through `SqliteStore`, so these tests are the
locking tests of all three. The concurrency tests use real processes writing one real file.
"""
from __future__ import annotations
import multiprocessing, os, sqlite3, threading, time

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from kgrag_nb.store import SqliteStore, is_locked

KV = "CREATE TABLE IF NOT EXISTS kv (k TEXT PRIMARY KEY, v BLOB)"


def _writer(path: str, worker: int, n: int, batch: int):
    "A separate process: `n` rows in transactions of `batch` rows each, through its own store."
    s = SqliteStore(path, KV)
    for i in range(0, n, batch):
        s.write_many("INSERT INTO kv VALUES (?, ?)", [(f"w{worker}-{j}", str(os.getpid()).encode()) for j in range(i, min(n, i + batch))])
    s.close()


def test_nothing_is_opened_until_first_use(tmp_path):
    s = SqliteStore(tmp_path / "a" / "b.sqlite", KV)
    assert not s.exists() and not (tmp_path / "a").exists()
    assert s.read("SELECT * FROM kv") == [] and s.exists()


def test_wal_busy_timeout_and_synchronous_are_set(tmp_path):
    s = SqliteStore(tmp_path / "s.sqlite", KV, busy_timeout_s=2.5)
    assert s.read_one("PRAGMA journal_mode") == ("wal",)
    assert s.read_one("PRAGMA busy_timeout") == (2500,)
    assert s.read_one("PRAGMA synchronous") == (1,)  # NORMAL
    s.close()
    with sqlite3.connect(tmp_path / "s.sqlite") as other:  # WAL is a property of the file: another connection sees it
        assert other.execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_concurrent_writers_from_several_processes_lose_nothing(tmp_path):
    path = tmp_path / "many.sqlite"
    ctx = multiprocessing.get_context("spawn")  # fresh interpreters: no state shared with this one
    procs = [ctx.Process(target=_writer, args=(str(path), w, 60, 7)) for w in range(4)]
    for p in procs: p.start()
    for p in procs: p.join(120)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    s = SqliteStore(path, KV)
    rows = s.read("SELECT k, v FROM kv")
    assert len(rows) == 240 and {k for k, _ in rows} == {f"w{w}-{j}" for w in range(4) for j in range(60)}
    assert len({v for _, v in rows}) == 4  # four writer processes


def test_a_store_opened_before_a_fork_gets_a_new_connection_in_the_child(tmp_path):
    s = SqliteStore(tmp_path / "fork.sqlite", KV)
    s.write(("INSERT INTO kv VALUES ('parent', NULL)", ()))
    parent_conn = s.connect()
    def child():
        assert s.connect() is not parent_conn
        s.write(("INSERT INTO kv VALUES (?, NULL)", (f"child{os.getpid()}",)))
    procs = [multiprocessing.get_context("fork").Process(target=child) for _ in range(2)]
    for p in procs: p.start()
    for p in procs: p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]
    assert s.connect() is parent_conn  # the parent's connection is untouched and still works
    assert s.read_one("SELECT COUNT(*) FROM kv") == (3,)


def test_threads_share_one_store(tmp_path):
    s = SqliteStore(tmp_path / "t.sqlite", KV)
    def work(t):
        for i in range(25): s.write(("INSERT INTO kv VALUES (?, NULL)", (f"{t}-{i}",)))
    ts = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in ts: t.start()
    for t in ts: t.join()
    assert s.read_one("SELECT COUNT(*) FROM kv") == (100,)


def test_an_exception_inside_a_write_rolls_all_of_it_back(tmp_path):
    s = SqliteStore(tmp_path / "r.sqlite", KV)
    s.write(("INSERT INTO kv VALUES ('keep', NULL)", ()))
    def half(conn):
        conn.execute("INSERT INTO kv VALUES ('a', NULL)")
        conn.execute("INSERT INTO kv VALUES ('b', NULL)")
        raise RuntimeError("stop here")
    with pytest.raises(RuntimeError, match="stop here"): s.transaction(half)  # the caller's error, unchanged
    with pytest.raises(sqlite3.OperationalError, match=r"nothing of this write was stored"):  # a SQL error mid-batch
        s.write(("INSERT INTO kv VALUES ('c', NULL)", ()), ("INSERT INTO kv VALUES ('keep', NULL)", ()))
    with pytest.raises(sqlite3.OperationalError, match=r"SQLite store .*r\.sqlite: UNIQUE constraint failed"):
        s.write_many("INSERT INTO kv VALUES (?, NULL)", [("d",), ("d",)])
    assert s.read("SELECT k FROM kv") == [("keep",)]
    s.write(("INSERT INTO kv VALUES ('after', NULL)", ()))  # no transaction was left open
    assert s.read_one("SELECT COUNT(*) FROM kv") == (2,)


def test_a_write_error_names_the_store_and_the_fix(tmp_path):
    s = SqliteStore(tmp_path / "named.sqlite", KV, what="LLM response cache")
    with pytest.raises(sqlite3.OperationalError) as e: s.write(("INSERT INTO nope VALUES (1)", ()))
    assert f"LLM response cache {tmp_path / 'named.sqlite'}: no such table: nope" in str(e.value)
    assert "Free disk space" in str(e.value) and isinstance(e.value.__cause__, sqlite3.OperationalError)


def test_a_locked_write_is_retried_once(tmp_path):
    "A lock held past one busy timeout but released before the second try: the write lands."
    path = tmp_path / "lock.sqlite"
    s = SqliteStore(path, KV, busy_timeout_s=0.5)
    s.connect()
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    threading.Timer(0.6, lambda: other.execute("COMMIT")).start()
    t0 = time.monotonic()
    s.write(("INSERT INTO kv VALUES ('late', NULL)", ()))
    assert time.monotonic() - t0 >= 0.5  # the first try waited out its timeout
    assert s.read_one("SELECT k FROM kv") == ("late",)
    other.close()


def test_a_lock_held_throughout_fails_after_two_tries(tmp_path):
    path = tmp_path / "held.sqlite"
    s = SqliteStore(path, KV, busy_timeout_s=0.1)
    s.connect()
    calls = []
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        t0 = time.monotonic()
        with pytest.raises(sqlite3.OperationalError, match="database is locked.*nothing of this write was stored") as e:
            s.transaction(lambda conn: calls.append(1))
        assert time.monotonic() - t0 >= 0.2 and calls == []  # two tries of 0.1 s; the batch never started
        assert "held its write lock" in str(e.value)
    finally: other.execute("ROLLBACK"); other.close()


def test_is_locked():
    assert is_locked(sqlite3.OperationalError("database is locked"))
    assert is_locked(sqlite3.OperationalError("database is busy"))
    assert not is_locked(sqlite3.OperationalError("disk I/O error"))
    assert not is_locked(RuntimeError("database is locked"))


def test_transaction_returns_its_result_and_may_read(tmp_path):
    s = SqliteStore(tmp_path / "ret.sqlite", KV)
    s.write_many("INSERT INTO kv VALUES (?, NULL)", iter([("x",), ("y",)]))  # an iterator works
    def move(conn):
        n = conn.execute("SELECT COUNT(*) FROM kv").fetchone()[0]
        conn.execute("DELETE FROM kv WHERE k='x'")
        return n
    assert s.transaction(move) == 2 and s.read("SELECT k FROM kv") == [("y",)]


def test_close_and_reopen(tmp_path):
    with SqliteStore(tmp_path / "c.sqlite", KV) as s:
        s.write(("INSERT INTO kv VALUES ('a', NULL)", ()))
        first = s.connect()
    assert s._conn is None  # closed on exit
    assert s.read_one("SELECT k FROM kv") == ("a",) and s.connect() is not first


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.dictionaries(st.text(max_size=30), st.one_of(st.none(), st.binary(max_size=200), st.integers(-2**63, 2**63 - 1),
                                                             st.floats(allow_nan=False), st.text(max_size=50)), max_size=30))
def test_round_trip(tmp_path, rows):
    "What is written in one batch reads back identical, keys and values of every SQLite type."
    s = SqliteStore(tmp_path / "prop.sqlite", "CREATE TABLE IF NOT EXISTS kv (k TEXT PRIMARY KEY, v)")
    s.write(("DELETE FROM kv", ()))
    s.write_many("INSERT INTO kv VALUES (?, ?)", rows.items())
    back = dict(s.read("SELECT k, v FROM kv"))
    assert back == rows and all(type(back[k]) is type(v) for k, v in rows.items())
    s.close()


def test_readonly_reads_a_live_store_and_refuses_writes(tmp_path):
    "A reader of another module's cache (`readonly=True`): sees committed rows, writes nothing, needs the file to exist."
    w = SqliteStore(tmp_path / "live.sqlite", KV)
    w.write(("INSERT INTO kv VALUES ('a', NULL)", ()))
    ro = SqliteStore(tmp_path / "live.sqlite", "CREATE TABLE never (x)", readonly=True)  # no schema is run
    assert ro.read("SELECT k FROM kv") == [("a",)]
    w.write(("INSERT INTO kv VALUES ('b', NULL)", ()))  # a writer goes on while the reader is open (WAL)
    assert ro.read("SELECT k FROM kv ORDER BY k") == [("a",), ("b",)]
    with pytest.raises(PermissionError, match="read-only"): ro.write(("DELETE FROM kv", ()))
    with pytest.raises(sqlite3.OperationalError): ro.connect().execute("DELETE FROM kv")  # SQLite refuses too (mode=ro)
    assert w.read_one("SELECT COUNT(*) FROM kv") == (2,) and w.read("SELECT name FROM sqlite_master WHERE name='never'") == []
    with pytest.raises(FileNotFoundError, match="absent.sqlite does not exist; a read-only store reads an existing file"):
        SqliteStore(tmp_path / "absent.sqlite", readonly=True).read("SELECT 1")
    assert not (tmp_path / "absent.sqlite").exists()
