"""I/O faults (SPEC §1-§4, §6): a failed read, write, sync or lock never breaks the file.

A VFS wrapping the default one fails the Nth read (xRead), write (xWrite),
sync (xSync) or lock (xLock) call after it is armed, with SQLITE_IOERR_* or
SQLITE_FULL (and SQLITE_BUSY for locks). "once" fails that call only (a
transient error); "sticky" fails it and every later call of that kind until
the Database is closed (a disk that stays full or broken: closing's
checkpoint fails too, and the next open recovers from the WAL as after a
crash). The WAL is "empty" when the operation starts, or "warm" (it holds a
commit made just before). For every write operation and N = 1, 2, ... until
the operation no longer reaches the Nth call, an attempt starts from a copy
of one populated file, and:

- the operation returns, or raises an ``AgentStateError`` (never a driver error);
- reopened with the normal VFS, ``db.check() == []``;
- the logical state is exactly the state before if it raised, exactly the
  state after (as without a fault) if it returned;
- ("once") the same Database keeps working after the transient fault.

An open WAL connection keeps its SHARED lock on the database file and
writers lock in shared memory (xShmLock, which an apsw VFS cannot reach), so
xLock happens only while a connection opens or closes: lock faults are
injected into an operation that is the first call of a new thread (its
connection opens inside it), and into open() itself.
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import apsw
import pytest

import agentstate
from agentstate import AgentStateError, Principal

VFS_NAME = "agentstate-faults"
KINDS = ("read", "write", "sync", "lock")
ERRORS = {  # error name -> result code raised, per kind of call
    "IOERR": {"read": apsw.SQLITE_IOERR_READ, "write": apsw.SQLITE_IOERR_WRITE,
              "sync": apsw.SQLITE_IOERR_FSYNC, "lock": apsw.SQLITE_IOERR_LOCK},
    "FULL": dict.fromkeys(KINDS, apsw.SQLITE_FULL),
    "BUSY": {"lock": apsw.SQLITE_BUSY},
}
# SQLITE_BUSY only ever comes from a lock: no VFS returns it from xRead, xWrite
# or xSync, and SQLite relies on that. Its checkpoint reads "BUSY" as "readers
# are active, try later" and reports success, so a BUSY injected into the
# checkpoint run by close() lets SQLite delete a WAL holding acknowledged
# commits. That is SQLite given an impossible result, not a store bug.
MODES = ("once", "sticky")
MAX_N = 60
ALICE = Principal("alice")
ADMIN = Principal("ops", admin=True)


# -- the faulty VFS ----------------------------------------------------------

class Fault:
    """Which calls fail: the ``n``-th call of ``kind`` after arming (and later ones if sticky)."""

    def __init__(self) -> None:
        self.disarm()

    def arm(self, kind: str, code: int, n: int, sticky: bool) -> None:
        self.kind, self.code, self.n, self.sticky = kind, code, n, sticky
        self.calls = self.fired = 0

    def disarm(self) -> None:
        self.kind, self.code, self.n, self.sticky = None, 0, 0, False
        self.calls = self.fired = 0

    def hit(self, kind: str) -> None:
        if kind != self.kind:
            return
        self.calls += 1
        if self.calls == self.n or (self.sticky and self.calls > self.n):
            self.fired += 1
            raise apsw.exception_for(self.code)


FAULT = Fault()


class FaultFile(apsw.VFSFile):
    """A file of the default VFS whose reads, writes, syncs and locks may fail."""

    def __init__(self, name: Any, flags: list[int]) -> None:
        super().__init__("", name, flags)

    def xRead(self, amount: int, offset: int) -> bytes:
        FAULT.hit("read")
        return super().xRead(amount, offset)

    def xWrite(self, data: bytes, offset: int) -> None:
        FAULT.hit("write")
        super().xWrite(data, offset)

    def xSync(self, flags: int) -> None:
        FAULT.hit("sync")
        super().xSync(flags)

    def xLock(self, level: int) -> None:
        FAULT.hit("lock")
        super().xLock(level)


class FaultVFS(apsw.VFS):
    """The default VFS, opening every file (database, WAL, temp files) as a FaultFile."""

    def __init__(self) -> None:
        super().__init__(VFS_NAME, "")

    def xOpen(self, name: Any, flags: list[int]) -> FaultFile:
        return FaultFile(name, flags)


_VFS = FaultVFS()  # registered for the life of the module


# -- the state every attempt starts from ---------------------------------------

def populate(db: agentstate.Database) -> dict[str, str]:
    """A little of everything; returns the ids the operations need."""
    a = db.scope("agent", "bot")
    a.put("counter", 1)
    a.put("counter", 2)
    a.put("doc", {"a": [1, 2], "b": "x"})
    a.put_bytes("blob", b"\x00\x01raw")
    a.append("hist", [1, 2, 3])
    a.put("gone", 1)
    a.delete("gone")
    db.scope("user", "u-7").put("name", "Ann")
    cfg = db.scope("app", "cfg")
    for i in range(30):  # several pages, so an operation reads and writes more than one
        cfg.put(f"k{i:02d}", {"i": i, "pad": "x" * 300})
    db.runs.write("r1", [{"seq": 0, "type": "user", "text": "hi"},
                         {"seq": 1, "type": "tool_call", "call_id": "c1"}],
                  {"task": "t", "turn": 1}, create=True)
    db.runs.write("r2", [{"seq": 0, "type": "user"}], None, create=True)
    s1 = db.sessions.create(ALICE, metadata={"n": 1})
    running = db.sessions.start_turn(s1.id, ALICE, input={"m": "go"}, lease=3600)
    db.scope("session", s1.id).append("history", [{"role": "user"}])
    s2 = db.sessions.create(ALICE)
    db.sessions.start_turn(s2.id, ALICE, lease=3600).finish({"ok": True})
    t = db.sessions.start_turn(s2.id, ALICE, lease=3600).hold({"q": "first?"})
    decided = db.sessions.decide(t.id, ALICE, {"yes": True})
    held = db.sessions.start_turn(s2.id, ALICE, lease=3600).hold({"q": "again?"})
    return {"s1": s1.id, "s2": s2.id, "running": running.id, "held": held.id,
            "decided": decided.id}


def _transaction(db: agentstate.Database, ids: dict[str, str]) -> Callable[[], Any]:
    def act() -> Any:
        with db.transaction():
            db.scope("agent", "bot").put("doc", {"in": "tx"})
            db.scope("user", "u-7").append("log", [1, 2])
            db.scope("app", "cfg").delete("k05")
            db.scope("session", ids["s1"]).append("history", [{"role": "assistant"}])
            db.scope("thread", "t-new").put_bytes("b", b"tx")
        return "done"
    return act


# Each operation: (db, ids) -> the call to make once the fault is armed. What
# comes before the call (fetching a Turn) runs unarmed.
OPS: dict[str, Callable[[agentstate.Database, dict[str, str]], Callable[[], Any]]] = {
    "put": lambda db, ids: lambda: db.scope("agent", "bot").put("doc", {"a": 2, "new": [True]}),
    "put_new_key": lambda db, ids: lambda: db.scope("thread", "t-1").put("fresh", "value"),
    "put_if_version": lambda db, ids: lambda: db.scope("agent", "bot").put("counter", 3, if_version=2),
    "delete": lambda db, ids: lambda: db.scope("agent", "bot").delete("hist"),
    "update": lambda db, ids: lambda: db.scope("agent", "bot").update("counter", lambda n: n + 1),
    "append": lambda db, ids: lambda: db.scope("agent", "bot").append("hist", [4, {"five": 5}]),
    "put_bytes": lambda db, ids: lambda: db.scope("agent", "bot").put_bytes("blob", b"\xffnew"),
    "transaction": _transaction,
    "runs_write_create": lambda db, ids: lambda: db.runs.write(
        "r3", [{"seq": i, "type": "user", "text": "y" * 500} for i in range(3)], {"task": "new"},
        create=True),
    "runs_write_continue": lambda db, ids: lambda: db.runs.write(
        "r1", [{"seq": 1, "type": "tool_call", "call_id": "c1"},
               {"seq": 2, "type": "tool_result", "call_id": "c1"}], {"task": "t", "turn": 2}),
    "runs_fork": lambda db, ids: lambda: db.runs.fork("r1", "r1-fork", upto=0),
    "runs_delete": lambda db, ids: lambda: db.runs.delete("r1"),
    "sessions_create": lambda db, ids: lambda: db.sessions.create(ALICE, metadata={"k": "v"}),
    "sessions_delete": lambda db, ids: lambda: db.sessions.delete(ids["s1"], ALICE),
    "start_turn": lambda db, ids: lambda: db.sessions.start_turn(
        ids["s2"], ALICE, input={"m": "next"}, lease=3600),
    "finish": lambda db, ids: db.sessions.get_turn(ids["running"], ALICE).finish,
    "hold": lambda db, ids: (lambda t: lambda: t.hold({"q": "may I?"}))(
        db.sessions.get_turn(ids["running"], ALICE)),
    "decide": lambda db, ids: lambda: db.sessions.decide(ids["held"], ALICE, {"approved": True}),
    "resume": lambda db, ids: lambda: db.sessions.resume(ids["decided"], ALICE, lease=3600),
}


# -- the logical state -------------------------------------------------------

def _turn(t: agentstate.Turn) -> tuple[Any, ...]:
    return (t.id, t.n, t.status, t.input, t.request, t.decision, t.result, t.error, t.lease)


def normal(value: Any) -> Any:
    """A returned value without its times: comparable between two runs."""
    if isinstance(value, agentstate.Turn):
        return _turn(value)
    if isinstance(value, agentstate.SessionInfo):
        return (value.id, value.owner, value.metadata)
    return value


def dump(path: str) -> dict[str, Any]:
    """Everything a user can see, without times: kv rows, deleted versions, runs, sessions, turns."""
    with agentstate.open(path) as db:
        problems = db.check()
        runs = {s.id: tuple(db.runs.read(s.id)) for s in db.runs.list()}
        sessions = {
            s.id: (s.owner, s.metadata, sorted((_turn(t) for t in db.sessions.turns(s.id, ADMIN)), key=lambda t: t[1]))
            for s in db.sessions.list(ADMIN)
        }
    c = apsw.Connection(path, flags=apsw.SQLITE_OPEN_READONLY)
    try:
        kv = c.execute(
            """SELECT kind, scope_id, key, type, version, length, size,
                      CASE type WHEN 'list' THEN (SELECT json_group_array(json(item)) FROM
                          (SELECT item FROM list_item WHERE list_id = kv.list_id ORDER BY idx))
                      ELSE value END
               FROM kv ORDER BY kind, scope_id, key""").fetchall()
        deleted = c.execute("SELECT * FROM kv_deleted ORDER BY 1, 2, 3").fetchall()
        run_rows = c.execute("SELECT id, snapshot, next_seq, format FROM run ORDER BY id").fetchall()
    finally:
        c.close()
    return {"check": problems, "kv": kv, "kv_deleted": deleted, "run_rows": run_rows,
            "runs": runs, "sessions": sessions}


def _new_ids(state: Any, known: set[str], seen: dict[str, str]) -> Any:
    """Replace ids made by the operation (a new session or turn) by stable names."""
    if isinstance(state, str) and state[:2] in ("s-", "t-") and len(state) == 34 and state not in known:
        return seen.setdefault(state, f"<new {len(seen)}>")
    if isinstance(state, dict):
        return {_new_ids(k, known, seen): _new_ids(v, known, seen) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(_new_ids(v, known, seen) for v in state) if not hasattr(state, "_fields") \
            else type(state)(*(_new_ids(v, known, seen) for v in state))
    return state


def canonical(state: Any, known: set[str]) -> Any:
    out = _new_ids(state, known, {})
    if isinstance(out, dict) and "kv" in out:  # new ids change the sort order of scopes
        out["kv"] = sorted(out["kv"], key=repr)
        out["sessions"] = dict(sorted(out["sessions"].items()))
    return out


WARM = ("thread", "probe", "before-fault")  # committed before arming: the WAL is not empty
PROBE = ("thread", "probe", "after-fault")  # committed after a transient fault


def without_probes(state: dict[str, Any]) -> dict[str, Any]:
    return {**state, "kv": [r for r in state["kv"] if r[:2] != PROBE[:2]]}


# -- fixtures ----------------------------------------------------------------

def _scratch_base(fallback: Path) -> Path:
    """Where attempts run: tmpfs when there is one (fsync is free there; every
    xSync still goes through the faulty VFS, so what is tested is the same)."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        return Path(tempfile.mkdtemp(prefix="agentstate-faults-", dir=shm))
    return fallback


class Template:
    """The populated file every attempt copies, and the states before and after each operation."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.path = str(folder / "template.db")
        self._names = itertools.count()
        with agentstate.open(self.path) as db:
            self.ids = populate(db)
        assert not Path(self.path + "-wal").exists()
        self.known = set(self.ids.values())
        path = self.copy()
        self.before = dump(path)
        self.discard(path)
        assert self.before["check"] == []
        self.before_canonical = canonical(self.before, self.known)
        self._after: dict[str, tuple[Any, Any]] = {}

    def copy(self) -> str:
        dest = self.folder / f"a{next(self._names)}"
        dest.mkdir()
        shutil.copyfile(self.path, dest / "agent.db")
        return str(dest / "agent.db")

    @staticmethod
    def discard(path: str) -> None:
        shutil.rmtree(os.path.dirname(path), ignore_errors=True)

    def after(self, op: str) -> tuple[Any, Any]:
        """(returned value, state), both canonical, of the operation without any fault."""
        if op not in self._after:
            path = self.copy()
            with agentstate.open(path, vfs=VFS_NAME) as db:
                result = normal(OPS[op](db, self.ids)())
            state = dump(path)
            self.discard(path)
            assert state["check"] == []
            assert state != self.before, f"{op} changes nothing: not a write"
            self._after[op] = (canonical(result, self.known), canonical(state, self.known))
        return self._after[op]


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Template]:
    folder = _scratch_base(tmp_path_factory.mktemp("faults"))
    yield Template(folder)
    shutil.rmtree(folder, ignore_errors=True)


# -- one attempt ---------------------------------------------------------------

def _call(act: Callable[[], Any], new_thread: bool) -> Any:
    """``act()``, on a new thread if asked: its first call opens that thread's connection."""
    if not new_thread:
        return act()
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = act()
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            box["error"] = e

    t = threading.Thread(target=run)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def attempt(template: Template, op: str, kind: str, code: int, n: int, sticky: bool,
            warm: bool) -> tuple[bool, list[str]]:
    """Run ``op`` with the fault armed at call ``n``; (fault fired, problems found)."""
    path = template.copy()
    problems: list[str] = []
    FAULT.disarm()
    db = agentstate.open(path, vfs=VFS_NAME, busy_timeout=0.05)
    try:
        act = OPS[op](db, template.ids)
        if warm:
            db.scope(*WARM[:2]).put(WARM[2], n)
        FAULT.arm(kind, code, n, sticky)
        try:
            # An open WAL connection keeps its SHARED lock on the database file
            # (writers lock in shared memory), so xLock is reached only while
            # a connection opens: lock faults hit the op's own new connection.
            outcome, value = "returned", normal(_call(act, kind == "lock"))
        except AgentStateError as e:
            outcome, value = "raised", e
        except BaseException as e:  # noqa: BLE001 - the point: nothing else may escape
            outcome, value = "escaped", e
        fired = FAULT.fired > 0
        probed = False
        if not sticky:
            FAULT.disarm()
            try:  # a transient fault must not leave the Database unusable
                db.scope(*PROBE[:2]).put(PROBE[2], n)
                probed = True
            except BaseException as e:  # noqa: BLE001
                problems.append(f"the next write after the fault raised {type(e).__name__}: {e}")
    finally:
        db.close()  # sticky: closing meets the fault too (its checkpoint fails)
        FAULT.disarm()

    if outcome == "escaped":
        template.discard(path)
        problems.append(f"raised {type(value).__module__}.{type(value).__name__}: {value}")
        return fired, problems
    state = dump(path)
    template.discard(path)
    if state["check"]:
        problems.append(f"check() found {state['check']}")
    for probe, done in ((WARM, warm), (PROBE, probed)):
        if done and not any(r[:3] == probe and r[7] == str(n) for r in state["kv"]):
            problems.append(f"the write acknowledged {probe[2]} is missing")
    got = canonical(without_probes(state), template.known)
    ref_result, after = template.after(op)
    before = template.before_canonical
    if outcome == "returned":
        value = canonical(value, template.known)
        if value != ref_result:
            problems.append(f"returned {value!r}, without a fault {ref_result!r}")
        if got != after:
            problems.append("returned, but the state is not the state after the operation"
                            + (" (it is the state before)" if got == before else ""))
    elif got != before and not (getattr(value, "outcome_unknown", False) and got == after):
        # Only a failed COMMIT (its WAL frames may already be on disk, e.g. when the
        # fsync fails) may leave the state after; it says so with outcome_unknown.
        problems.append(f"raised {type(value).__name__}({value}), but the state is not the state "
                        "before" + (" (it is the state after)" if got == after else ""))
    return fired, problems


WALS = ("empty", "warm")  # the WAL when the operation starts: new, or holding a commit
CASES = [(op, kind, err, mode, wal) for op in OPS for kind in KINDS for err in ERRORS
         if kind in ERRORS[err] for mode in MODES for wal in WALS]


@pytest.mark.parametrize(("op", "kind", "err", "mode", "wal"), CASES,
                         ids=["-".join(c) for c in CASES])
def test_operation_under_io_fault(template: Template, op: str, kind: str, err: str, mode: str,
                                  wal: str) -> None:
    """An operation hit by an I/O fault returns or raises AgentStateError, and leaves a sound file holding exactly the state after or the state before."""
    failures = []
    for n in range(1, MAX_N + 1):
        fired, problems = attempt(template, op, kind, ERRORS[err][kind], n, mode == "sticky",
                                  wal == "warm")
        failures += [f"N={n}: {p}" for p in problems]
        if not fired:
            break
    assert not failures, f"{op} with {err} on {kind} call N ({mode}, {wal} WAL):\n" + "\n".join(failures)
    assert not fired, f"{op} still reaches the fault at N={MAX_N}: the sweep is incomplete"


OPEN_CASES = [(kind, err, mode) for kind in KINDS for err in ERRORS if kind in ERRORS[err]
              for mode in MODES]


@pytest.mark.parametrize(("kind", "err", "mode"), OPEN_CASES, ids=["-".join(c) for c in OPEN_CASES])
def test_open_under_io_fault(template: Template, kind: str, err: str, mode: str) -> None:
    """Opening an existing file hit by an I/O fault succeeds or raises AgentStateError, and changes nothing."""
    failures = []
    for n in range(1, MAX_N + 1):
        path = template.copy()
        FAULT.arm(kind, ERRORS[err][kind], n, mode == "sticky")
        try:
            agentstate.open(path, vfs=VFS_NAME, busy_timeout=0.05).close()
        except AgentStateError:
            pass
        except BaseException as e:  # noqa: BLE001 - the point: nothing else may escape
            failures.append(f"N={n}: raised {type(e).__module__}.{type(e).__name__}: {e}")
        fired = FAULT.fired > 0
        FAULT.disarm()
        state = dump(path)
        template.discard(path)
        if state != template.before:
            failures.append(f"N={n}: the state changed (check: {state['check']})")
        if not fired:
            break
    assert not failures, f"open with {err} on {kind} call N ({mode}):\n" + "\n".join(failures)
    assert not fired, f"open still reaches the fault at N={MAX_N}: the sweep is incomplete"
