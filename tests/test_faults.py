"""Fault injection: kill the whole run, kill a worker, duplicate work, replayed streams,
a full disk. Each test states how the fault is injected and checks nothing is lost or
counted twice."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import (
    copy_project,
    copy_study,
    reuse_arms_check,
    run_processes,
    run_snakemake,
    small_config,
    write_config,
)

from pairflow.errors import PairFlowError
from pairflow.evidence.archive import verify_tree
from pairflow.layout import Layout
from pairflow.records.store import read_record

pytestmark = pytest.mark.slow
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))


def kill_everything_under(project: Path, pgid: int) -> None:
    """Cleanup for a test that failed half-way: SIGKILL the run's process group, then
    every process left of the run (found by ``run_processes``, by PID)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for pid in run_processes(project, pgid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _stat(pid: int) -> tuple[int, str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return int(fields[1]), fields[0]


def _running(pid: int) -> bool:
    """Alive and not a zombie, read once: a process may exit between two reads of /proc (a CI run
    failed on `_stat(p) and _stat(p)[1]` when the job exited between them)."""
    stat = _stat(pid)
    return stat is not None and stat[1] not in "ZX"


def _parent(pid: int) -> int | None:
    stat = _stat(pid)
    return stat[0] if stat else None


def complete_records(scratch: Path) -> list[Path]:
    done = []
    for p in sorted((scratch / "panels").rglob("records/*/*.json")):
        try:
            read_record(p)
            done.append(p)
        except PairFlowError:
            pass
    return done


def wait_for(predicate, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


SLOWER = {"frames": 9, "height": 64, "width": 64, "steps": 24}
"""Generation heavy enough (about 5x slower than the default test size) that a run cannot finish
in the second a kill takes to reach every process."""


def make(tmp: Path, tiny_model: Path, name: str, seeds: list[int] | None = None, relative: bool = False,
         **over: object) -> tuple[Path, dict]:
    """A project copy with panel ``t``: 3 prompts x ``seeds`` (default [0, 1]) x 2 arms,
    its arms already checked (the faults here strike the panel job). ``relative``: storage
    and sheet named relative to the project, so a copy of the project folder is a study of
    its own (``copy_study``)."""
    project = copy_project(tmp / name)
    cfg = small_config(project, tiny_model, **over)
    (project / "config" / "panels").mkdir(parents=True, exist_ok=True)
    sheet = project / "config" / "panels" / "t.tsv"
    sheet.write_text("prompt_id\tprompt\na1\ta red fox\na2\twaves\na3\ta paper boat\n")
    cfg["panels"]["t"] = {"sheet": "config/panels/t.tsv" if relative else str(sheet), "seeds": seeds or [0, 1]}
    if relative:
        cfg["storage"] = {"scratch": "results/scratch", "work": "results/work"}
    write_config(project, cfg)
    reuse_arms_check(project, cfg)
    return project, cfg


def scratch_of(project: Path, cfg: dict) -> Path:
    return project / cfg["storage"]["scratch"]  # an absolute scratch stays itself


GENERATION = "results/scratch/panels/t/generation.json"
"""The faults here all strike generation, so runs stop at its manifest (under the default
``fleet.panel_jobs: combined`` the panel's one job, generate_score_panel, also scores):
timing and statistics over the same records are exercised by test_workflow."""
NOTE = {"kind": "retirement", "snapshot": "s", "why": "", "archive_root_digest": None, "found": [], "by": "me",
        "at": "2026-12-01T00:00:00+00:00"}
"""A small complete record (an archive retirement note)."""


def run(project: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([SNAKEMAKE, GENERATION, "--cores", "2", "--configfile", "config/config.yaml", *args],
                          cwd=project, capture_output=True, text=True, timeout=900)


def candidates_view(scratch: Path) -> dict:
    out = {}
    for p in sorted((scratch / "panels").rglob("records/*/*.json")):
        r = read_record(p)
        out[r["candidate"]["candidate_id"]] = (r["video"]["digest"], r["video"]["raw_digest"])
    return out


SHARED = {"generation": SLOWER, "seeds": [0, 1, 2]}
"""What enters the shared panel's records (with small_config's model, arms and encoder): a
run with these settings has the same candidates and bytes, whatever its fleet."""


@pytest.fixture(scope="module")
def generated_panel(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """One finished, undisturbed run of panel ``t`` at ``SHARED`` settings (18 candidates),
    shared by the fault cases that need a generated panel: a reference for bytes, or a
    study to copy (``copy_study``) and damage. It runs the per-stage rule generate_panel
    (``fleet.panel_jobs: per-stage``) with 2 workers, so a test comparing with it shows
    too that neither job shape nor worker count changes what is computed. Read-only."""
    project, cfg = make(tmp_path_factory.mktemp("shared"), tiny_model, "panel", relative=True,
                        fleet={"cpu_workers": 2, "retries": 1, "panel_jobs": "per-stage"}, **SHARED)
    res = run(project)
    assert res.returncode == 0, res.stderr[-5000:]
    assert "rule generate_panel" in res.stderr and "rule generate_score_panel" not in res.stderr, res.stderr[-3000:]
    assert len(complete_records(scratch_of(project, cfg))) == 18
    return project, cfg


def same_computation(cfg: dict, shared: dict, seeds: bool = True) -> None:
    """``cfg`` and the shared panel's config differ at most in where things are kept and how
    the work is spread (storage, sheet path, fleet): every setting a record's digests
    depend on (study, model, arms, generation, encoder, prompts; ``seeds``: seeds too,
    else ``cfg``'s are a subset) is the same. make() writes every project the same sheet."""
    def computed(c: dict) -> dict:
        return {k: v for k, v in c.items() if k not in ("storage", "fleet", "panels")}
    assert computed(cfg) == computed(shared)
    mine, theirs = cfg["panels"]["t"]["seeds"], shared["panels"]["t"]["seeds"]
    assert mine == theirs if seeds else set(mine) <= set(theirs)


def test_whole_run_killed_mid_panel_resumes_only_unfinished(tiny_model: Path, tmp_path: Path,
                                                            generated_panel: tuple[Path, dict]) -> None:
    """Injected: SIGKILL to the snakemake driver process alone, once at least 3 of 18
    candidates have records. Its job process, Parsl interchange and worker pool (with
    multiprocessing's helpers) must end by themselves within seconds, releasing the panel
    lock; nothing is left running. Then: unlock, rerun.

    Regression (CI, stop 19): at 32x32x5 frames and 3 steps a candidate takes about 65 ms,
    so the ~1 s the orphans need to notice the kill finished all 12 candidates and left
    nothing to resume. Candidates here are ~5x slower (~0.35 s) and there are 18 of them: about
    5 s of work remains after the third record. The resumed run's bytes are compared with
    the shared undisturbed run (``generated_panel``)."""
    project, cfg = make(tmp_path, tiny_model, "killed", **SHARED)
    scratch = Path(cfg["storage"]["scratch"])
    proc = subprocess.Popen([SNAKEMAKE, GENERATION, "--cores", "2", "--configfile", "config/config.yaml"],
                            cwd=project,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for(lambda: len(complete_records(scratch)) >= 3, 300, "three records")
        running = run_processes(project, proc.pid)
        assert len(running) >= 6, running  # snakemake, job, interchange, pool, its workers and helpers
        proc.kill()
        proc.wait()
        killed = time.monotonic()
        wait_for(lambda: not [p for p in running if _running(p)], 60,
                 "every process of the killed run to end by itself")
        orphan_s = time.monotonic() - killed
    finally:
        kill_everything_under(project, proc.pid)
    assert not run_processes(project, proc.pid)
    from pairflow.locks import hold

    with hold(scratch / "panels" / "t", "test"):  # the panel lock went with the job process
        pass
    time.sleep(1)
    done_at_kill = len(complete_records(scratch))
    assert done_at_kill < 18, "the run finished before the kill took effect: nothing left to resume"
    # Nothing partial under a final name: every final-named record and video verifies.
    for p in (scratch / "panels").rglob("*"):
        if p.is_file() and not p.name.startswith(".tmp-") and p.suffix == ".json" and "/records/" in str(p):
            read_record(p)
    print(f"\nFAULT driver SIGKILL: {len(running)} processes of the run ended {orphan_s:.1f}s after it")
    started = time.monotonic()
    assert run(project, "--unlock").returncode == 0
    res = run(project)
    assert res.returncode == 0, res.stderr[-5000:]
    recovery_s = time.monotonic() - started
    log = (scratch / "logs" / "generate-score" / "t.log").read_text()
    assert f"generate t: 18 candidates, {done_at_kill} complete, {18 - done_at_kill} to run" in log
    assert len(complete_records(scratch)) == 18
    assert verify_tree(scratch) == []
    # Same bytes as an uninterrupted run of the same study (the shared one: per-stage jobs,
    # 2 workers; this one: the combined job, 1 worker), and the same records but for where
    # and when they were made (stable_root: config digest, compute, video fields ...).
    other, cfg2 = generated_panel
    same_computation(cfg, cfg2)
    assert candidates_view(scratch) == candidates_view(scratch_of(other, cfg2))
    gen1 = json.loads((scratch / "panels" / "t" / "generation.json").read_text())
    gen2 = json.loads((scratch_of(other, cfg2) / "panels" / "t" / "generation.json").read_text())
    assert gen1["stable_root"] == gen2["stable_root"]
    print(f"\nFAULT whole-run-kill: done at kill {done_at_kill}/18, recovery {recovery_s:.1f}s")


def _payload(tmp: Path, tiny_model: Path) -> dict:
    from pairflow.generation.provenance import provenance
    from pairflow.plan.candidates import candidates
    from pairflow.plan.config import study_from_raw
    from pairflow.plan.context import write_context

    cfg = small_config(tmp, tiny_model)
    study = study_from_raw(cfg, tmp)
    c = candidates(study, study.panels[0])[0]
    return {"context": write_context(study.scratch, {"study": study, "provenance": provenance(study)}), "candidate": c}


def _generate(payload: dict) -> None:
    from pairflow.stages.generation import generate_task

    generate_task(payload)


def test_same_candidate_produced_twice_yields_one_record(tiny_model: Path, tmp_path: Path) -> None:
    """Injected: two processes generate the same candidate at the same time (two workers,
    or a retry racing a slow success). Atomic renames onto one deterministic name."""
    import multiprocessing as mp

    from pairflow.plan.candidates import record_path, video_path
    from pairflow.plan.context import load_context
    from pairflow.records.store import check_video

    payload = _payload(tmp_path, tiny_model)
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_generate, args=(payload,)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)
        assert p.exitcode == 0
    study, c = load_context(payload["context"])["study"], payload["candidate"]
    rec_dir = record_path(Layout(study.scratch), c).parent
    assert [p.name for p in rec_dir.iterdir()] == [record_path(Layout(study.scratch), c).name]
    assert [p.name for p in video_path(Layout(study.scratch), c).parent.iterdir()] == [video_path(Layout(study.scratch), c).name]
    check_video(read_record(record_path(Layout(study.scratch), c)), record_path(Layout(study.scratch), c))


def test_two_candidates_replaying_one_stream_are_rejected() -> None:
    """Injected: two records of different pairs that carry the same stream seed."""
    from pairflow.errors import IntegrityError
    from pairflow.records.store import check_streams

    def rec(prompt: str, seed: int, stream: int, arm: str = "control") -> dict:
        return {"candidate": {"panel": "p", "prompt_id": prompt, "seed": seed, "stream_seed": stream},
                "arm": {"name": arm}}

    check_streams([rec("a", 0, 11), rec("a", 0, 11, "fb"), rec("b", 0, 12)])  # a pair shares its stream: fine
    with pytest.raises(IntegrityError, match="replay the same random stream 11: p/a seed 0 and p/b seed 0"):
        check_streams([rec("a", 0, 11), rec("b", 0, 11)])


@pytest.fixture
def small_fs(tmp_path: Path):  # type: ignore[no-untyped-def]
    mnt = tmp_path / "fs"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=600k", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here (needs root and CAP_SYS_ADMIN)")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_disk_full_gives_a_clear_error_and_no_partial_files(small_fs: Path, encoder_spec) -> None:  # type: ignore[no-untyped-def]
    """Injected: a 600 KiB tmpfs filled by a ballast file, then an encode and a record write."""
    import numpy as np

    from pairflow.errors import StorageError
    from pairflow.media.video import encode
    from pairflow.records.store import write_record

    ballast = _fill(small_fs)
    frames = np.random.default_rng(0).integers(0, 256, (9, 64, 64, 3), dtype=np.uint8)
    with pytest.raises(StorageError, match="no space left .*v.mp4.*Free space"):
        encode(frames, small_fs / "v.mp4", encoder_spec, 8)
    with pytest.raises(StorageError, match="no space left .*r.json"):
        write_record(small_fs / "r.json", {**NOTE, "why": "y" * 100_000})
    assert sorted(p.name for p in small_fs.iterdir()) == ["ballast"]  # nothing partial, no temp files
    ballast.unlink()
    info = encode(frames, small_fs / "v.mp4", encoder_spec, 8)
    write_record(small_fs / "r.json", {**NOTE, "why": "y"})
    assert info.frames == 9 and read_record(small_fs / "r.json", "retirement")["why"] == "y"


def _fill(folder: Path) -> Path:
    """Fill the file system of ``folder`` with a ballast file (until ENOSPC); returns it."""
    ballast = folder / "ballast"
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError:
        pass  # ENOSPC: the file system is full
    finally:
        os.close(fd)
    return ballast


def test_a_full_disk_fails_a_task_on_its_heartbeat_with_the_named_storage_error(small_fs: Path) -> None:
    """Issue 40: on a full scratch disk a task died on a raw heartbeat OSError before any
    writer could name the disk. The heartbeat is a writer too: StorageError names the
    file and the fix, no temporary file is left, and the task's work never started."""
    from pairflow.errors import StorageError
    from pairflow.fleet.pool import traced

    beats = small_fs / "heartbeats"
    beats.mkdir()
    (beats / "filler").write_bytes(b"")  # the folder's own block, before the disk fills
    ballast = _fill(small_fs)
    ran: list[dict] = []
    with pytest.raises(StorageError, match=rf"^no space left on device writing {beats}/.+\.json \(\[Errno 28\] "
                       r"No space left on device.*\); nothing was written under that name. Free space on "):
        traced(lambda p: ran.append(p) or {}, {"x": 1}, beat_dir=str(beats), what="task 0", task=0)
    assert ran == [] and sorted(p.name for p in beats.iterdir()) == ["filler"]
    ballast.unlink()
    assert traced(lambda p: {"got": p["x"]}, {"x": 1}, beat_dir=str(beats), what="task 0", task=0)["result"] == {
        "got": 1}


def _worker_running_a_task(scratch: Path) -> tuple[int, str] | None:
    """A Parsl worker found by its role: the process whose heartbeat file (``fleet.traced``,
    ``<host>-<pid>.json``) says it is running a task now; with its parent's command line
    (the fork server under ``fleet.worker_start: forkserver``, Parsl's pool under spawn)."""
    for f in scratch.rglob("heartbeats/*.json"):
        try:
            beat = json.loads(f.read_text())
            parent = Path(f"/proc/{beat['pid']}/stat").read_text()
            ppid = int(parent[parent.rindex(")") + 2:].split()[1])
            cmd = Path(f"/proc/{ppid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError, KeyError):
            continue  # being replaced, or its worker just ended
        if beat.get("phase") == "task":
            return int(beat["pid"]), cmd
    return None


def test_worker_killed_mid_task_is_retried_once_and_counted_once(tiny_model: Path, tmp_path: Path,
                                                                  generated_panel: tuple[Path, dict]) -> None:
    """Injected: SIGKILL to one Parsl worker process while it runs a task (found by role:
    its heartbeat names the task; under the default ``fleet.worker_start: forkserver`` it
    is a child of the pool's fork server, not of the pool manager) while the panel is
    being generated. Parsl reports the task lost, retries it (retries: 1) and forks a
    replacement; no process of the run is left once Snakemake ends, and its candidates
    (the lost one retried) are bit-identical to the shared undisturbed run's."""
    project, cfg = make(tmp_path, tiny_model, "worker", fleet={"cpu_workers": 2, "retries": 1},
                        generation=SLOWER)  # so the panel is still running when the kill lands
    scratch = Path(cfg["storage"]["scratch"])
    proc = subprocess.Popen([SNAKEMAKE, GENERATION, "--cores", "2", "--configfile", "config/config.yaml"],
                            cwd=project,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    found: list[tuple[int, str]] = []

    def running() -> bool:
        worker = _worker_running_a_task(scratch) if len(complete_records(scratch)) >= 2 else None
        found[:] = [worker] if worker else []
        return bool(found)

    try:
        wait_for(running, 300, "two records and a worker running a task")
        killed, parent = found[0]
        os.kill(killed, signal.SIGKILL)
        out, _ = proc.communicate(timeout=900)
        try:  # polled, not a fixed second: on a loaded machine the pool may take a few to go
            wait_for(lambda: not run_processes(project, proc.pid), 20, "the run's processes to end")
        except AssertionError:
            pass  # reported below, by PID
        left = run_processes(project, proc.pid)
    finally:
        if proc.poll() is None:
            kill_everything_under(project, proc.pid)
    assert proc.returncode == 0, out[-5000:]
    assert not left, f"processes {left} outlived the run"
    records = sorted((scratch / "panels").rglob("records/*/*.json"))
    assert len(records) == 12 and len(complete_records(scratch)) == 12  # nothing lost, nothing twice
    assert not list((scratch / "panels").rglob(".tmp-*"))
    assert verify_tree(scratch) == []
    shared, shared_cfg = generated_panel
    same_computation(cfg, shared_cfg, seeds=False)
    view = candidates_view(scratch)
    assert view.items() <= candidates_view(scratch_of(shared, shared_cfg)).items()
    print(f"\nFAULT worker-kill: killed worker pid {killed} (parent: {parent[:80]}); 12/12 records, no temp files left")


def test_corruption_is_detected_and_regeneration_repairs_it(generated_panel: tuple[Path, dict],
                                                            tmp_path: Path) -> None:
    """Injected after a finished run (a copy of the shared one, ``generated_panel``, whose
    panel jobs are per-stage): a truncated video, a flipped byte in a record, a video
    replaced by other bytes, a deleted record. `pairflow verify` names each; the documented
    recovery (`--forcerun generate_panel`; `generate_score_panel` under the default
    ``fleet.panel_jobs: combined``) regenerates exactly those candidates."""
    shared, cfg = generated_panel
    project = copy_study(shared, tmp_path / "corrupt")
    scratch = scratch_of(project, cfg)
    before = candidates_view(scratch)
    assert len(before) == 18
    panel = scratch / "panels" / "t"
    video = panel / "videos" / "pab" / "a1-s0.mp4"
    video.write_bytes(video.read_bytes()[: video.stat().st_size // 2])  # truncated
    rec = panel / "records" / "control" / "a2-s1.json"
    data = bytearray(rec.read_bytes())
    data[len(data) // 2] ^= 0x01
    rec.write_bytes(bytes(data))  # flipped byte
    (panel / "videos" / "control" / "a3-s0.mp4").write_bytes((panel / "videos" / "pab" / "a3-s0.mp4").read_bytes())
    (panel / "records" / "pab" / "a2-s0.json").unlink()  # deleted record
    pf = str(Path(sys.executable).with_name("pairflow"))
    v = subprocess.run([pf, "verify", str(scratch)], capture_output=True, text=True)
    assert v.returncode == 1
    for name in ("a1-s0.json", "a2-s1.json", "a3-s0.json", "a2-s0.json"):
        assert name in v.stdout, (name, v.stdout)
    started = time.monotonic()
    res = run(project, "--forcerun", "generate_panel")
    assert res.returncode == 0, res.stderr[-5000:]
    log = (scratch / "logs" / "generate" / "t.log").read_text()
    assert "generate t: 18 candidates, 14 complete, 4 to run" in log
    assert candidates_view(scratch) == before  # regenerated bit for bit
    # The run stops at the panel's manifests, so verify (which proves the whole study
    # complete) still lists the later stages as missing; nothing of generation is wrong.
    after = json.loads(subprocess.run([pf, "verify", str(scratch), "--json"], capture_output=True, text=True).stdout)
    generation = [p for p in after["problems"] if "/records/" in p["file"] or "/videos/" in p["file"]
                  or p["file"].endswith("generation.json")]
    assert generation == [] and {p["kind"] for p in after["problems"]} == {"missing"}
    assert candidates_view(scratch_of(shared, cfg)) == before  # the shared run untouched
    print(f"\nFAULT corruption: 4 damaged candidates detected and regenerated in {time.monotonic() - started:.1f}s")


def test_ffmpeg_failing_in_a_worker_fails_the_panel_job_with_its_message_in_the_rule_log(
        tiny_model: Path, tmp_path: Path) -> None:
    """Injected: a bad ffmpeg binary (the real one, started with an option it does not know)
    for every encode inside the Parsl workers. ffmpeg-python's error cannot be unpickled by
    the driver, which used to wait forever; the job must fail with ffmpeg's words in its log."""
    from pairflow.media.video import ffmpeg_binary
    from pairflow.plan.config import EncoderSpec

    real = ffmpeg_binary(EncoderSpec("", "libx264", 18, "medium", "yuv420p", 9, 1, False, False))
    bad = tmp_path / "bad-ffmpeg"
    # Bad inside Parsl workers only (PARSL_WORKER_RANK set): the calibration worker, which
    # runs before the fan-out, encodes with the real one.
    bad.write_text(f'#!/bin/sh\ncase " $* " in *" -version "*) exec {real} "$@";; esac\n'
                   f'[ -z "$PARSL_WORKER_RANK" ] && exec {real} "$@"\n'
                   f'exec {real} -frobnicate 1 "$@"\n')
    bad.chmod(0o755)
    project, cfg = make(tmp_path, tiny_model, "badffmpeg", encoder={"ffmpeg": str(bad)},
                        fleet={"cpu_workers": 1, "retries": 0})
    started = time.monotonic()
    res = run(project)
    took = time.monotonic() - started
    assert res.returncode != 0
    log = (Path(cfg["storage"]["scratch"]) / "logs" / "generate-score" / "t.log").read_text()
    assert "EncodeError" in log and "Unrecognized option 'frobnicate'" in log, log[-3000:]
    assert "uncaught TaskFailedError" in log and "Traceback (most recent call last)" in log
    import datetime

    stamps = [(datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f"), line[24:]) for line in log.splitlines()
              if line[:4].isdigit() and line[4:5] == "-"]
    first_failure = next(t for t, rest in stamps if rest.startswith("ERROR"))
    after = (stamps[-1][0] - first_failure).total_seconds()
    assert after < 60, f"the job ran on {after:.0f}s after its first failed task"
    assert took < 300, f"the failing run took {took:.0f}s"
    print(f"\nFAULT bad ffmpeg in a worker: run failed after {took:.1f}s, {after:.1f}s after the first "
          "failed task, with ffmpeg's message in the rule log")


def _heartbeat_in(scratch: Path, phase: str) -> bool:
    for f in scratch.rglob("heartbeats/*.json"):
        try:
            if json.loads(f.read_text()).get("phase") == phase:
                return True
        except (OSError, ValueError):
            continue
    return False


def _job_process(project: Path, root: int) -> int:
    """The panel job's process (Snakemake's rule script: the Parsl driver), by PID."""
    for pid in run_processes(project, root):
        try:
            if b"generate_score_panel" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
        except OSError:
            continue
    raise AssertionError("no panel job process found")


def _live(pids: list[int]) -> list[int]:
    return [p for p in pids if _running(p)]


@pytest.mark.parametrize("targets", ["job", "job and its children"])
def test_sigterm_during_warm_up_ends_the_panel_job_and_its_pool_within_10s(tiny_model: Path, tmp_path: Path,
                                                                            targets: str) -> None:
    """Injected: SIGTERM to the panel job process while its workers are still in warm-up
    (importing torch and the scorers); or, as Slurm's scancel and walltime do, to the job
    and its children at once (the Parsl interchange then dies before the job can shut the
    pool down through it). Regression (issue 22): it ran on for more than 8 minutes."""
    # spawn: each worker imports torch and the scorers itself, a warm-up of seconds to catch. Under the
    # default forkserver the imports happen once in the fork server and a worker's warm-up (0.2 s) can
    # pass between two polls (CI missed it once); a forked pool ending with its driver: tests/test_fleet.py.
    project, cfg = make(tmp_path, tiny_model, "termwarm", fleet={"cpu_workers": 1, "retries": 0,
                                                                 "worker_start": "spawn"})
    scratch = Path(cfg["storage"]["scratch"])
    proc = subprocess.Popen([SNAKEMAKE, GENERATION, "--cores", "2", "--configfile", "config/config.yaml"],
                            cwd=project, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: _heartbeat_in(scratch, "warm-up"), 300, "a worker in warm-up")
        job = _job_process(project, proc.pid)
        tree = [p for p in run_processes(project, proc.pid) if p != proc.pid]
        children = [c for c in tree if _parent(c) == job]
        assert children or targets == "job", tree
        for pid in [job, *(children if targets != "job" else [])]:
            os.kill(pid, signal.SIGTERM)
        sent = time.monotonic()
        wait_for(lambda: not _live([job]), 10, "the job process to exit after SIGTERM")
        job_s = time.monotonic() - sent
        wait_for(lambda: not _live(tree), 15, "the job's interchange and worker pool to end")
        out, _ = proc.communicate(timeout=60)
    finally:
        kill_everything_under(project, proc.pid)
    assert proc.returncode != 0
    log = (scratch / "logs" / "generate-score" / "t.log").read_text()
    assert "SIGTERM received: stopping this job and its Parsl worker pool" in log, log[-2000:]
    print(f"\nFAULT SIGTERM in warm-up: job exited {job_s:.1f}s after the signal, pool gone")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupting_snakemake_ends_the_run_visibly_within_10s(tiny_model: Path, tmp_path: Path, sig) -> None:
    """Injected: Ctrl-C (SIGINT to the run's whole process group, as a terminal sends it)
    or SIGTERM to Snakemake, while the panel job generates. Regression (issue 22): no
    visible reaction for 60 s. Snakemake must exit within 10 s saying so, leaving no process.
    Regression (issue 41): the console then ended with RuleException, CalledProcessError,
    "Error in rule" and WorkflowError lines and the job's own; it now ends with one line
    saying what was stopped and how to resume (the job's own is in its log), exit 128 + signal."""
    project, cfg = make(tmp_path, tiny_model, f"int{sig}", generation=SLOWER, seeds=[0, 1, 2],
                        fleet={"cpu_workers": 1, "retries": 0})
    scratch = Path(cfg["storage"]["scratch"])
    proc = subprocess.Popen([SNAKEMAKE, GENERATION, "--cores", "2", "--configfile", "config/config.yaml"],
                            cwd=project, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                            text=True)
    try:
        wait_for(lambda: len(complete_records(scratch)) >= 1, 300, "a first record")
        tree = run_processes(project, proc.pid)
        if sig == signal.SIGINT:
            os.killpg(proc.pid, sig)
        else:
            os.kill(proc.pid, sig)
        sent = time.monotonic()
        out, _ = proc.communicate(timeout=60)
        took = time.monotonic() - sent
        wait_for(lambda: not _live(tree), 20, "every process of the run to end")
    finally:
        kill_everything_under(project, proc.pid)
    print(f"\nFAULT {signal.Signals(sig).name} to snakemake: exit {proc.returncode} after {took:.1f}s; output ends:\n"
          + out[-1500:])
    assert took < 10, out[-3000:]
    assert proc.returncode == 128 + sig
    name = signal.Signals(sig).name
    # Snakemake's, visible, and the last line. A SIGINT to the group reaches the job process too,
    # which may have ended (exit 130) before Snakemake's handler counts its running jobs: 1 or 0 then.
    said = out[out.index(f"pairflow: {name} received"):].splitlines()
    assert len(said) == 1, out[-3000:]
    assert re.fullmatch(rf"pairflow: {name} received: stopped (1 running job\(s\) \(generate_score_panel\), each with "
                        r"its Parsl workers|the run \(no job left running\)); completed candidates are kept: run the same "
                        r"command again to resume \(Snakemake's account: \.snakemake/log/\)", said[0]), said
    log = (scratch / "logs" / "generate-score" / "t.log").read_text()
    assert "received: stopping this job and its Parsl worker pool" in log  # the job's own, in its log
    account = "".join(p.read_text() for p in (project / ".snakemake" / "log").glob("*.log"))
    assert "Error in rule generate_score_panel" in account  # Snakemake's own, in its log


def test_a_hung_encoder_fails_the_job_within_the_stall_timeout_and_a_slow_start_does_not(
        tiny_model: Path, tmp_path: Path) -> None:
    """Injected: an ffmpeg that hangs without reading its input (a fake binary set as
    encoder/ffmpeg; it answers -version like the real one). Regression (issue 22): the
    heartbeat thread beat while the task was blocked, so the job never stalled. With
    stall_timeout_s 10, below the workers' start-up (pool, torch, diffusers, scorers), the
    slow start must not fail the job; the hang must, within 10 s plus the driver's poll and
    cleanup."""
    from pairflow.media.video import ffmpeg_binary
    from pairflow.plan.config import EncoderSpec

    real = ffmpeg_binary(EncoderSpec("", "libx264", 18, "medium", "yuv420p", 9, 1, False, False))
    hung = tmp_path / "hung-ffmpeg"
    marker = tmp_path / "hung.started"
    # Hung inside Parsl workers only: the calibration worker (before the fan-out) encodes.
    hung.write_text(f'#!/bin/sh\ncase " $* " in *" -version "*) exec {real} "$@";; esac\n'
                    f'[ -z "$PARSL_WORKER_RANK" ] && exec {real} "$@"\n'
                    f'touch {marker}\nexec sleep 600\n')
    hung.chmod(0o755)
    project, cfg = make(tmp_path, tiny_model, "hung", encoder={"ffmpeg": str(hung)},
                        fleet={"cpu_workers": 1, "retries": 0, "stall_timeout_s": 10})
    proc = subprocess.Popen([SNAKEMAKE, GENERATION, "--cores", "2", "--configfile", "config/config.yaml"],
                            cwd=project, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                            text=True)
    try:
        out, _ = proc.communicate(timeout=600)
        ended = time.time()
    finally:
        kill_everything_under(project, proc.pid)
    assert proc.returncode != 0
    log = (Path(cfg["storage"]["scratch"]) / "logs" / "generate-score" / "t.log").read_text()
    assert "StalledError" in log and "stall_timeout_s: 10" in log, log[-3000:]
    assert "ffmpeg" in log and "consumed" in log  # the slot's last progress: ffmpeg fed, then nothing
    ready = next(line for line in log.splitlines() if "a worker is ready after" in line)
    startup = float(ready.split("ready after ")[1].split("s")[0])
    hung_s = ended - marker.stat().st_mtime
    print(f"\nFAULT hung encoder: start-up {startup:.0f}s did not stall; the job failed {hung_s:.1f}s after "
          "ffmpeg hung (stall_timeout_s 10)")
    assert hung_s < 10 + 30, hung_s


KILL_HOOK = '''\
"""Test hook (tests/test_faults.py): SIGKILL this process (``PAIRFLOW_TEST_KILL_GROUP=1``:
its whole process group, Snakemake included) when the archive logs the step
``PAIRFLOW_TEST_KILL_AT`` (``pairflow.evidence.archive.step``)."""
import logging
import os
import signal

_AT = os.environ.get("PAIRFLOW_TEST_KILL_AT")


class _Kill(logging.Handler):
    def emit(self, record):
        if getattr(record, "archive_step", None) == _AT:
            for other in logging.getLogger().handlers:  # the rule's log shows the step it died at
                if other is not self:
                    other.handle(record)
                    other.flush()
            if os.environ.get("PAIRFLOW_TEST_KILL_GROUP") == "1":
                os.killpg(os.getpgid(0), signal.SIGKILL)
            os.kill(os.getpid(), signal.SIGKILL)


if _AT:
    logging.getLogger().addHandler(_Kill())
'''


@pytest.fixture(scope="module")
def archived_study(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One finished run of the whole workflow (panel ``t``: 3 prompts x 1 seed x 2 arms),
    archive included, storage relative (``copy_study`` makes a study of its own). Read-only."""
    project, _cfg = make(tmp_path_factory.mktemp("archived"), tiny_model, "study", seeds=[0], relative=True)
    run_snakemake(project)
    return project


ARCHIVE_STEPS = ["hashed", "copied", "packed panels/t/generation", "packed", "sealed", "read-only", "latest",
                 "swept", "verified", "archived"]
"""Every step the archive rule logs (``evidence.archive.step``), in order: ``packed
panels/t/generation`` is mid-packing (the first of the panel's three packs written),
``packed`` after every pack before ``archive.json``, ``sealed`` after ``archive.json``,
``read-only`` before ``latest.json``, ``verified`` before the rule's output, ``archived``
after it, before the job exits."""


@pytest.mark.parametrize("at, group", [*((s, False) for s in ARCHIVE_STEPS), ("packed panels/t/generation", True)])
def test_an_archive_killed_at_any_step_is_healed_by_a_plain_rerun(archived_study: Path, tmp_path: Path,
                                                                  at: str, group: bool) -> None:
    """Injected: SIGKILL of the real archive job of a Snakemake run (``group``: of its whole
    process group, Snakemake too, as when a node dies) when it logs step ``at``: a hook
    (``sitecustomize`` on the job's PYTHONPATH) that watches the archive's step log
    records. Then a plain rerun (after ``--unlock`` when Snakemake itself died): both
    ``pairflow verify`` (scratch, work storage) pass, exactly one snapshot exists, complete,
    and it has the id the killed run chose (the id depends only on the evidence), no pack
    or temp file is left over, and ``snakemake -n`` has nothing to do.

    Regression (issue 40): the plan memo and the archive job's own account were archived,
    so the rerun promoted a new snapshot beside the interrupted one and verify on work
    storage failed for ever while ``snakemake -n`` had nothing to do."""
    from pairflow.evidence.archive import verify_archive

    project = copy_study(archived_study, tmp_path / "study")
    scratch, work = project / "results" / "scratch", project / "results" / "work" / "test"
    first = json.loads((scratch / "study" / "archived.json").read_text())
    chmod_tree(work)
    import shutil

    shutil.rmtree(work)
    (scratch / "study" / "archived.json").unlink()
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(KILL_HOOK)
    env = {**os.environ, "PAIRFLOW_TEST_KILL_AT": at, "PAIRFLOW_TEST_KILL_GROUP": "1" if group else "0",
           "PYTHONPATH": os.pathsep.join([str(hook), *filter(None, [os.environ.get("PYTHONPATH")])])}
    killed = subprocess.run([SNAKEMAKE, "--profile", "profiles/local", "--configfile", "config/config.yaml"],
                            cwd=project, env=env, capture_output=True, text=True, timeout=900, start_new_session=True)
    assert killed.returncode != 0, killed.stderr[-3000:]
    log = (scratch / "logs" / "archive.log").read_text()
    assert f"archive step {at}" in log and not (scratch / "study" / "archived.json").exists(), log[-2000:]
    left = sorted(p.name for p in (work / "snapshots").iterdir()) if (work / "snapshots").is_dir() else []
    if group:
        assert run_snakemake(project, "--unlock")
    rerun = run_snakemake(project)
    assert "rule archive" in rerun
    pf = str(Path(sys.executable).with_name("pairflow"))
    for tree in (scratch, work):
        v = subprocess.run([pf, "verify", str(tree)], cwd=project, capture_output=True, text=True, timeout=600)
        assert v.returncode == 0, v.stdout[-3000:] + v.stderr[-3000:]
    report = verify_archive(work)
    (snap,) = (work / "snapshots").iterdir()
    assert report.ok and report.notes == [] and (snap / "archive.json").is_file(), report.lines()
    assert left in ([], [snap.name]), (left, snap.name)  # finished, not replaced
    # the same evidence as the undisturbed run: the same id
    assert Path(first["archive"]).name == snap.name, sealed_differences(Path(first["archive"]), snap)
    assert not [p for p in work.rglob(".tmp-*")]
    dry = subprocess.run([SNAKEMAKE, "--profile", "profiles/local", "--configfile", "config/config.yaml", "-n"],
                         cwd=project, capture_output=True, text=True, timeout=600)
    assert dry.returncode == 0 and "Nothing to be done" in dry.stdout + dry.stderr, dry.stdout[-3000:]
    print(f"\nFAULT archive killed at {at!r}{' (with Snakemake)' if group else ''}: left {left or 'no snapshot'}; "
          f"the rerun finished {snap.name}; both verifies OK, snakemake -n has nothing to do")


def chmod_tree(root: Path) -> None:
    """Give back the write bits a sealed snapshot dropped, so a test can remove it."""
    for dirpath, _dirs, _files in os.walk(root):
        os.chmod(dirpath, 0o755)


def sealed_differences(one: Path, two: Path) -> list[str]:
    """What two snapshots seal differently: plain files, and packed files by group."""
    from pairflow.evidence.archive import load_manifest, snapshot_files
    from pairflow.records.packs import Pack

    out = []
    m1, m2 = load_manifest(one), load_manifest(two)
    for rel in sorted(set(m1["files"]) | set(m2["files"])):
        if m1["files"].get(rel) != m2["files"].get(rel):
            out.append(f"{rel}: {m1['files'].get(rel)} / {m2['files'].get(rel)}")
    p1, p2 = snapshot_files(one, m1)[0], snapshot_files(two, m2)[0]
    for group in sorted(set(p1) | set(p2)):
        a = {k: v.digest for k, v in Pack(p1[group]).members.items()} if group in p1 else {}
        b = {k: v.digest for k, v in Pack(p2[group]).members.items()} if group in p2 else {}
        out += [f"{group}: {rel}: {a.get(rel)} / {b.get(rel)}" for rel in sorted(set(a) | set(b)) if a.get(rel) != b.get(rel)]
    return out
