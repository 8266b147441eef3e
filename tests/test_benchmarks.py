"""Smoke run of the benchmark command (``python -m benchmarks.run --quick``).

Checks that every workload gives agentstate and raw apsw a number and a ratio,
that a peer that is not installed is reported as such, and that the run is
quick. Peers and matplotlib are optional: without matplotlib the chart is
skipped and the markdown still written. No timing target is asserted.
"""

from __future__ import annotations

import pytest

import re
import subprocess
import sys
from pathlib import Path

import agentstate

REPO = Path(__file__).resolve().parent.parent
WORKLOADS = ["put", "get", "update", "contention", "append", "history", "list", "coldopen"]
NUM = r"[0-9][0-9,.]*(?: ms)?"
RATIO = r"\*\*[0-9.]+×\*\*"


def _section(md: str, n: int) -> str:
    m = re.search(rf"^### {n}\. .*?(?=^### |\Z)", md, re.S | re.M)
    assert m, f"no section {n} in RESULTS.md"
    return m.group(0)


@pytest.mark.slow  # a smoke run of a benchmark command (seconds of imports): CI's -m slow
def test_quick_run_writes_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "out"
    p = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "--quick", "--repeats", "2", "--out", str(out),
         "--workdir", str(tmp_path / "work"),
         # a light peer (when installed) plus one reported as not installed
         "--systems", "agentstate,apsw,sqlitedict,lg_saver", "--pretend-missing", "lg_saver"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert p.returncode == 0, p.stderr[-3000:]

    md = (out / "RESULTS.md").read_text(encoding="utf-8")
    for key in ("## Machine", "## Durability", "## Targets", "## Headline ratios", "cores", "Python",
                "SQLite (apsw)"):
        assert key in md
    for n, name in enumerate(WORKLOADS, 1):
        sec = _section(md, n)
        for system in ("agentstate", "raw apsw"):
            rows = re.findall(rf"^\| {system} \| (.*)$", sec, re.M)
            assert rows, f"{name}: no row for {system}"
            for row in rows:  # a number (median, min–max) and a ratio to raw apsw in every table
                assert re.match(rf"{NUM} \({NUM}–{NUM}\) \| ", row), f"{name}/{system}: {row}"
                assert re.search(r"[0-9.]+×", row), f"{name}/{system}: no ratio in {row}"
        agent_rows = re.findall(r"^\| agentstate \| (.*)$", sec, re.M)
        assert all(re.search(RATIO, r) for r in agent_rows), name
        assert "1.00× (1.00–1.00)" in sec, f"{name}: raw apsw's own ratio"
        assert re.search(r"^\| langgraph SqliteSaver \| (not installed|n/a)", sec, re.M), name
    # the summary carries agentstate's ratio for every workload at FULL
    head = md.split("## Headline ratios", 1)[1].split("## Workloads", 1)[0]
    for label in ("put", "get", "update", "contention", "append", "write", "tail20", "list", "cold open"):
        assert re.search(rf"^\| {label}[^|]* \| {RATIO}", head, re.M), label

    png = out / "ratios.png"
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert not png.exists() and "chart not drawn" in md
    else:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow  # a smoke run of a benchmark command (seconds of imports): CI's -m slow
def test_feed_benchmark_quick_run(tmp_path: Path) -> None:
    """``python -m benchmarks.feed --quick`` measures wake-ups, idle CPU and churn (no target asserted)."""
    p = subprocess.run([sys.executable, "-m", "benchmarks.feed", "--quick", "--out", str(tmp_path)],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    md = (tmp_path / "FEED.md").read_text(encoding="utf-8")
    for section in ("## Wake-up latency", "## An idle watcher's CPU", "## A file under steady churn"):
        assert section in md
    assert re.search(r"\| `db\.watch` \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \|", md)
    assert re.search(r"\| `db\.awatch` \| [0-9.]+% \|", md)


@pytest.mark.slow  # a smoke run of a benchmark command (seconds of imports): CI's -m slow
def test_server_benchmark_quick_run(tmp_path: Path) -> None:
    """``python -m benchmarks.server --quick``: the API beside a bare endpoint (no target asserted)."""
    p = subprocess.run([sys.executable, "-m", "benchmarks.server", "--quick", "--out", str(tmp_path)],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    md = (tmp_path / "SERVER.md").read_text(encoding="utf-8")
    for workload in ("get", "put", "append", "turn"):
        assert re.search(rf"\| {workload} \| 16 \| [0-9,]+ \| [0-9,]+ \| [0-9.]+× \|", md), workload


def test_busy_benchmark_quick_run() -> None:
    """``python -m benchmarks.busy --quick`` runs both busy handlers (no target asserted)."""
    p = subprocess.run([sys.executable, "-m", "benchmarks.busy", "--quick"], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    for handler in ("SQLite's handler", "capped backoff (shipped)"):
        assert re.search(rf"\| {re.escape(handler)} \| [0-9,]+ \([0-9,]+–[0-9,]+\) \| [0-9]+ \| [0-9,]+ \| [0-9,]+ \|",
                         p.stdout), (handler, p.stdout)


def test_layout_benchmark_quick_run(tmp_path) -> None:
    """``python -m benchmarks.layout --quick`` rebuilds kv WITHOUT ROWID and measures both
    layouts through agentstate (no target asserted); the rebuilt file is still one that
    agentstate opens and checks clean, or the comparison would be of a broken store."""
    from benchmarks import layout

    path = str(tmp_path / "wr.db")
    agentstate.open(path).close()
    layout._without_rowid(path)
    with agentstate.open(path) as db:
        db.scope("app", "a").put("k", {"v": 1})
        assert db.check() == [] and db.scope("app", "a").get("k") == {"v": 1}
        assert "WITHOUT ROWID" in db._store.conn().execute(
            "SELECT sql FROM sqlite_schema WHERE name = 'kv'").fetchone()[0]
    p = subprocess.run([sys.executable, "-m", "benchmarks.layout", "--quick", "--out", str(tmp_path)],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    md = (tmp_path / "LAYOUT.md").read_text(encoding="utf-8")
    for size in ("150", "1,500", "3,000"):
        assert re.search(rf"\| {size} B \| without rowid \| [0-9.]+ \([0-9.]+×\) \|", md), (size, md)


def test_fence_benchmark_smoke():
    """benchmarks.fence times every operation it names, fenced and plain (SQLite here)."""
    from benchmarks import fence

    results = fence.run(rounds=1, calls=2, pg_url=None)
    text = fence.table(results) + "\n" + fence.ratios(results)
    assert "| put, fenced |" in text and "fenced ÷ plain" in text and "100,000 ÷ 100" in text


def test_every_revision_a_test_or_benchmark_names_is_on_mains_history() -> None:
    """A revision named by a constant whose comment says it is a commit (``BEFORE = "bd35024"  # the last
    commit ...``) is read with ``git show`` or
    ``git archive``; one that is not an ancestor of HEAD exists only in the clone it was
    made in (a commit later rebased), and the run that needs it fails on every other clone."""
    named = {}
    files = [*(REPO / "benchmarks").glob("*.py"), *(REPO / "tests").glob("*.py"),
             *(REPO / "tests" / "integrations").glob("*.py")]
    for path in files:
        for m in re.finditer(r'^[A-Z][A-Z0-9_]* = "([0-9a-f]{7,40})" *#.*\bcommit\b', path.read_text(), re.M):
            named[m.group(1)] = path.name
    assert {"bd35024", "be4f1f3"} <= set(named), named  # the scan finds the ones it is for
    for rev, where in named.items():
        done = subprocess.run(["git", "-C", str(REPO), "merge-base", "--is-ancestor", rev, "HEAD"],
                              capture_output=True, text=True)
        assert done.returncode == 0, f"{where} names {rev}, which is not on HEAD's history: {done.stderr}"
