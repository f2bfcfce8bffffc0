"""jobaccount: a job's own record of itself, written at start and at exit, and left
``running`` by a kill (whose end its last touch bounds)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil

from pairflow.budget.ledger import entries


def _job(folder: Path, body: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    code = textwrap.dedent(f"""
        from pairflow.jobaccount import open_account, note
        a = open_account({str(folder)!r}, "plots", {{"panel": "t"}}, attempt=2, threads=3, resources={{"gpu": 0}})
        print(a.path, flush=True)
    """) + textwrap.dedent(body)
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})


def test_a_job_that_ends_well_records_its_lifetime_cpu_and_notes(tmp_path: Path) -> None:
    before = time.time()
    proc = _job(tmp_path, "note('work', {'from': 'x', 'rows': {}})\nsum(range(3_000_000))\n")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    rec = json.loads(Path(out.strip()).read_text())
    assert rec["kind"] == "job-account" and rec["status"] == "ok" and rec["job"] == "plots-panel=t"
    assert rec["attempt"] == 2 and rec["threads"] == 3 and rec["resources"] == {"gpu": 0}
    # the process's kernel start, before any line of Python ran; the end after the work
    assert rec["start"] <= before + 0.5 and rec["end"] >= rec["start"] and rec["end"] <= time.time()
    assert rec["cpu_s"]["self"] > 0 and rec["notes"]["work"] == {"from": "x", "rows": {}}


def test_an_uncaught_exception_marks_the_account_failed_with_its_message(tmp_path: Path) -> None:
    proc = _job(tmp_path, "raise ValueError('bad input x')\n")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1
    rec = json.loads(Path(out.splitlines()[0]).read_text())
    assert rec["status"] == "failed" and rec["error"] == {"type": "ValueError", "message": "bad input x"}


def test_a_job_that_exits_non_zero_after_a_logged_refusal_says_so(tmp_path: Path) -> None:
    proc = _job(tmp_path, "from pairflow.jobaccount import failed\nfailed('BudgetError', 'refused')\nraise SystemExit(3)\n")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 3
    rec = json.loads(Path(out.splitlines()[0]).read_text())
    assert rec["status"] == "failed" and rec["error"] == {"type": "BudgetError", "message": "refused"}


def test_a_killed_job_stays_running_and_the_ledger_reads_it_killed_ending_at_its_last_touch(tmp_path: Path) -> None:
    proc = _job(tmp_path, "import time\ntime.sleep(60)\n")
    assert proc.stdout is not None
    path = Path(proc.stdout.readline().strip())
    time.sleep(1.0)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    rec = json.loads(path.read_text())
    assert rec["status"] == "running" and rec["end"] is None  # a kill writes nothing: it never looks complete
    (entry,) = entries(tmp_path, now=time.time() + 3600).values()
    assert entry["status"] == "killed"
    assert entry["held"]["end"] == path.stat().st_mtime  # not the hour later the ledger was read
    assert [(r["kind"], r["slot_s"]) for r in entry["rows"]] == [("failed", entry["held"]["slot_s"])]


def test_the_account_names_a_running_process_alive(tmp_path: Path) -> None:
    me = psutil.Process()
    account = {"kind": "job-account", "job": "x", "rule": "plots", "pid": os.getpid(), "start": me.create_time(),
               "host": socket.gethostname(), "status": "running", "end": None, "threads": 1, "notes": {}}
    (tmp_path / "job-x.json").write_text(json.dumps(account))
    (entry,) = entries(tmp_path, now=time.time()).values()
    assert entry["status"] == "running"
