"""The default study through ``snakemake --profile profiles/slurm`` on a real Slurm.

Needs a running cluster (``bash .ci/slurm-up`` starts a two-node one on loopback,
pf-node1 and pf-node2, each with two fake GPUs). Skipped where ``sinfo`` gets no answer, unless
``PAIRFLOW_REQUIRE_SLURM=1`` (set by ``.ci/run``), which turns the skip into a failure.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, copy_project, slurm_env

from pairflow.fleet.sites.slurm import cluster_unavailable
from pairflow.layout import SEALING_RULES

pytestmark = pytest.mark.slow
BIN = Path(sys.executable).parent



@pytest.fixture(scope="module")
def slurm_study(slurm, tmp_path_factory) -> Path:  # type: ignore[no-untyped-def]
    """The shipped default config and Slurm profile, unchanged, in a fresh project copy."""
    project = copy_project(tmp_path_factory.mktemp("slurm") / "project")
    shutil.copytree(ROOT / "config", project / "config")
    run = subprocess.run([str(BIN / "snakemake"), "--profile", "profiles/slurm"], cwd=project, env=slurm_env(),
                         capture_output=True, text=True, timeout=1500)
    (project / "snakemake.log").write_text(run.stdout + run.stderr)
    assert run.returncode == 0, (run.stdout + run.stderr)[-6000:]
    return project


def _records(project: Path, kind: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((project / "results/scratch/panels").glob(f"*/{kind}/*/*.json"))]


def test_default_study_runs_through_slurm_jobs(slurm_study: Path) -> None:
    scratch = slurm_study / "results/scratch"
    assert (scratch / "study/table.md").exists() and (scratch / "study/archived.json").exists()
    gen = _records(slurm_study, "records")
    assert len(gen) == 84  # 2 panels: (4 + 3 prompts) x 2 seeds x 6 arms (4 declared, 2 iso-compute controls)
    jobs = {r["worker"]["slurm_job"] for r in gen}
    assert None not in jobs and len(jobs) == 2  # one Slurm job per panel
    # ... which also scored it (fleet.panel_jobs: combined, the default): same job, same workers
    assert {r["worker"]["slurm_job"] for r in _records(slurm_study, "scores")} == jobs
    # Physical slot, logical device and stream are three different things, all recorded.
    slots = {(r["worker"]["host"], r["worker"]["gpu_index"]) for r in gen}
    assert len(slots) == 2, slots  # two distinct GPU slots, one per panel job (host, physical GPU)
    assert {r["worker"]["device"] for r in gen} == {"cpu"}  # torch sees no CUDA behind the fake gres
    assert len({r["candidate"]["stream_seed"] for r in gen}) == 14  # one stream per pair, shared by its arms


def test_timed_pass_ran_alone(slurm_study: Path) -> None:
    timings = _records(slurm_study, "timing")
    assert len(timings) == 84
    # timing.pairs: auto may stop before every pair (records saying so carry no worker)
    timed = [t for t in timings if t["sampled"]]
    assert len(timed) >= 2 * 5 * 4 and all(t["timing"].get("stopped") for t in timings if not t["sampled"])
    nodes = {json.dumps(t["worker"]["node"], sort_keys=True) for t in timed}
    assert len(nodes) == 1
    node = json.loads(nodes.pop())
    assert node["scheduler"] == "slurm" and node["exclusive"] is True, node  # scontrol: OverSubscribe=NO
    scratch = slurm_study / "results/scratch"
    window = json.loads((scratch / "study/telemetry/timed_pass.json").read_text())["window"]
    for tel in scratch.glob("panels/*/telemetry/*.json"):  # no task of another job overlapped it
        for span in json.loads(tel.read_text())["spans"]:
            assert span["finished"] <= window["start"] or span["started"] >= window["end"], (tel, span)


def test_utilisation_report_comes_from_spans(slurm_study: Path) -> None:
    u = json.loads((slurm_study / "results/scratch/study/utilisation.json").read_text())
    assert {j["job"] for j in u["jobs"]} == {"generate-score:smoke", "generate-score:motion"}  # one job per panel
    assert 0 < u["busy_share"] < 1
    for j in u["jobs"]:
        assert j["allocation"]["job_id"] and sum(v["tasks"] for v in j["slots"].values()) == j["tasks"]
    assert "NVML" in (slurm_study / "results/scratch/study/utilisation.md").read_text()


def test_snakemake_notices_each_finished_job_within_10_s(slurm_study: Path) -> None:
    """The profile's pairflow-slurm executor bounds the wait between status checks at 5 s
    (the stock plugin's backoff noticed jobs 35-65 s late): Slurm's end of each job to the
    second Snakemake logged it finished."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import slurm_jobs  # benchmarks/slurm_jobs.py

    finished = slurm_jobs.finished_at((slurm_study / "snakemake.log").read_text())
    assert len(finished) >= 3, finished  # two panel jobs and the timed pass
    lags = {job: at - slurm_jobs.slurm_times(job)["end"] for job, at in finished.items()}
    assert all(-1 <= lag <= 10 for lag in lags.values()), lags  # both to the whole second


SUBMITTED = re.compile(r"Job (\d+) has been submitted with SLURM jobid (\d+)")
RULE = re.compile(r"^(?:local)?rule (\w+):$", re.M)


def _check_ledger_against_slurm(project: Path) -> dict[str, dict]:
    """Every Slurm job this run submitted (Snakemake's log) is in the ledger, its held
    GPU-seconds within 5% of Slurm's; every local job too. Returns the Slurm jobs' entries."""
    log = (project / "snakemake.log").read_text()
    submitted = {m[2] for m in SUBMITTED.finditer(log)}
    ledger = json.loads((project / "results/scratch/study/ledger.json").read_text())
    mine = {j["slurm_job"]: j for j in ledger["jobs"].values() if j.get("slurm_job") in submitted}
    assert set(mine) == submitted, (sorted(submitted), sorted(mine))  # a job missing from the ledger fails here
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from slurm_ledger import slurm_held  # benchmarks/slurm_ledger.py: scontrol, read apart from the ledger's reader

    for job, entry in mine.items():
        ref = slurm_held(job)["gpu_s"]
        assert ref > 0 and abs(entry["held"]["gpu_s"] - ref) <= 0.05 * ref, (job, entry["held"], ref)
        assert entry["held"]["from"].startswith("scheduler"), entry["held"]
    return mine


def test_the_ledger_holds_every_job_at_the_gpu_seconds_slurm_held(slurm_study: Path) -> None:
    """Issue 38 item 1 (per-panel jobs): calibrate, both panel jobs and the timed pass, at
    Slurm's own figures (the exclusive timed pass holds its node's two GPUs); the local
    jobs too; the study's busy share is work over all of it, the figure status prints."""
    mine = _check_ledger_against_slurm(slurm_study)
    rules = sorted(j["rule"] for j in mine.values())
    assert rules == ["calibrate", "generate_score_panel", "generate_score_panel", "timed_pass"], rules
    (timed,) = [j for j in mine.values() if j["rule"] == "timed_pass"]
    assert timed["held"]["gpus"] == 2, timed["held"]  # --exclusive: the node's GPUs, all of them
    ledger = json.loads((slurm_study / "results/scratch/study/ledger.json").read_text())
    # the archive job seals the ledger into its snapshot, so the ledger never bills it (budget.ledger)
    ran = [r for r in RULE.findall((slurm_study / "snakemake.log").read_text()) if r not in ("all", *SEALING_RULES)]
    assert sorted(j["rule"] for j in ledger["jobs"].values()) == sorted(ran)
    t = ledger["totals"]
    assert 0 < t["busy_share"] < 1 and t["busy_share"] == pytest.approx(t["work_s"] / t["slot_s"])
    status = subprocess.run([str(BIN / "pairflow"), "status"], cwd=slurm_study, env=slurm_env(), capture_output=True,
                            text=True, timeout=120).stdout
    assert f"busy {t['busy_share']:.1%} of {t['slot_s']:.1f} slot-s" in status, status


def test_one_allocation_packs_a_worker_per_gpu(slurm, tmp_path: Path) -> None:
    """``pairflow probe-slots`` in an sbatch job with two GPUs: srun starts the pool, Parsl
    pins one worker to each granted GPU, and every no-op task runs on one of them."""
    out = tmp_path / "probe.json"
    cmd = f"{BIN / 'pairflow'} probe-slots --tasks 200 --out {out}"
    run = subprocess.run(["sbatch", "--wait", "--quiet", "--gres=gpu:2", "--cpus-per-task=2", "--time=10",
                          f"--output={tmp_path / 'probe.log'}", "--wrap", cmd], env=slurm_env(),
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, (tmp_path / "probe.log").read_text()[-4000:]
    t = json.loads(out.read_text())
    assert sorted(t["slots"]) == sorted(f"{h}/gpu{g}" for h in {s["host"] for s in t["spans"]} for g in ("0", "1"))
    assert all(v["tasks"] > 0 for v in t["slots"].values())
    assert t["allocation"]["gpus"] == ["0", "1"] and t["probe"]["tasks_per_s"] > 0
    assert {s["slurm_job"] for s in t["spans"]} == {t["allocation"]["job_id"]}


def test_a_client_with_no_cluster_behind_it_is_a_reason_to_skip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Slurm's client installed, no cluster configured: sinfo fails with "Could not
    establish a configuration source". The Slurm tests and the benchmarks' Slurm sections
    skip with that reason, and fail instead under PAIRFLOW_REQUIRE_SLURM=1."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import run  # benchmarks/run.py

    for tool in ("sinfo", "sbatch", "scontrol"):
        fake = tmp_path / tool
        fake.write_text("#!/bin/sh\necho 'sinfo: error: Could not establish a configuration source' >&2\nexit 1\n")
        fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    why = cluster_unavailable()
    assert why is not None and "Could not establish a configuration source" in why
    monkeypatch.delenv("PAIRFLOW_REQUIRE_SLURM", raising=False)
    for section in (run.bench_slurm, run.bench_slurm_study):
        assert section(1, quick=True) == {"skipped": why}
    monkeypatch.setenv("PAIRFLOW_REQUIRE_SLURM", "1")
    with pytest.raises(RuntimeError, match="PAIRFLOW_REQUIRE_SLURM=1 but no Slurm cluster answers"):
        run.bench_slurm(1, quick=True)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert "sinfo not found" in (cluster_unavailable() or "")


def test_the_allocation_start_is_read_for_whole_job_accounting() -> None:
    """Issue 25 item 3: under Slurm the busy share's job window opens at the allocation's
    start (SLURM_JOB_START_TIME), not when the job's Python started."""
    from pairflow.fleet.sites.slurm import allocation

    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_START_TIME": "1700000000"}
    assert allocation(env).start == 1700000000.0  # type: ignore[union-attr]
    assert allocation({"SLURM_JOB_ID": "7"}).start is None  # type: ignore[union-attr]


# --- one study-wide job over two nodes (fleet.allocation: study) -------------------------

NODE2 = "pf-node2"


def _descendants(pid: int) -> list[int]:
    """``pid`` and every process below it, from /proc (parents before children)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        out.append(todo.pop(0))
        todo += children.get(out[-1], [])
    return out


def _node_pool(node: str, job: str) -> int | None:
    """The PID of the Parsl worker pool (process_worker_pool.py) that Slurm job ``job``
    runs on ``node``: every CI node is this machine, so the pool is told apart by the
    node name Slurm put in its environment."""
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmd = (proc / "cmdline").read_bytes()
            if b"process_worker_pool" not in cmd and b"pairflow.fleet.workerpool" not in cmd:
                continue
            env = dict(v.split(b"=", 1) for v in (proc / "environ").read_bytes().split(b"\0") if b"=" in v)
        except OSError:
            continue
        if env.get(b"SLURMD_NODENAME") == node.encode() and env.get(b"SLURM_JOB_ID") == job.encode():
            return int(proc.name)
    return None


def _fail_stop(project: Path, run: subprocess.Popen[str], timeout_s: float) -> dict:
    """Once ``NODE2`` has finished work and is busy on a task, SIGKILL its worker pool and
    the pool's workers (the node fails and stops). Returns what was in flight there."""
    panel = project / "results/scratch/panels/smoke"
    fleet = project / "results/scratch/study/run/fleet"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and run.poll() is None:
        done = [r for r in _panel_records(panel, "records") if r["worker"]["host"] == NODE2]
        if done and _busy(fleet):
            job = done[0]["worker"]["slurm_job"]
            pool = _node_pool(NODE2, job)
            if pool is not None:
                pids = _descendants(pool)
                for pid in pids:
                    os.kill(pid, signal.SIGKILL)
                time.sleep(1)  # the workers are gone: their heartbeats are final
                return {"at": time.time(), "pids": pids, "job": job,  # a task that ended just before is not in flight
                        "in_flight": sorted({b["what"].rsplit(": ", 1)[1] for b in _busy(fleet)})}
        time.sleep(0.5)
    pytest.fail(f"{NODE2} never had a finished record and a busy worker within {timeout_s:.0f}s "
                f"(snakemake exit {run.poll()}); see {project / 'snakemake.log'}")


def _busy(run_dir: Path) -> list[dict]:
    """Heartbeats of ``NODE2``'s workers (in the job's Parsl run folder) that name a task
    (not warm-up, not idle)."""
    beats = []
    for b in (run_dir / "heartbeats").glob(f"{NODE2}-*.json"):
        try:
            beats.append(json.loads(b.read_text()))
        except (OSError, ValueError):
            continue  # replaced while read
    return [b for b in beats if b["phase"] == "task"]


def _panel_records(panel: Path, kind: str) -> list[dict]:
    out = []
    for p in sorted(panel.glob(f"{kind}/*/*.json")):
        try:
            out.append(json.loads(p.read_text()))
        except ValueError:
            continue  # being written (atomic rename: only while globbing races it)
    return out


@pytest.fixture(scope="module")
def two_node_panel(slurm_study: Path, tmp_path_factory) -> tuple[Path, dict]:  # type: ignore[no-untyped-def]
    """Panel ``smoke`` regenerated under ``fleet.allocation: study``: one Slurm job
    holding both nodes (the shipped profile's fleet_study: ``--nodes 2``, two GPUs each,
    unchanged), one Parsl pool per node; node 2's worker pool is killed mid-job. The
    project is a copy of the finished default study (relative storage: a copy is a study
    of its own) without panel ``smoke``, so its model, arms check and calibration table
    are reused and the fleet job is the one job that runs."""
    project = tmp_path_factory.mktemp("two-nodes") / "project"
    shutil.copytree(slurm_study, project, symlinks=True)
    shutil.rmtree(project / "results/scratch/panels/smoke")
    cfg = yaml.safe_load((project / "config/config.yaml").read_text())
    cfg["fleet"]["allocation"] = "study"
    (project / "config/config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    panel = "results/scratch/panels/smoke"
    with open(project / "snakemake.log", "w") as log:
        run = subprocess.Popen([str(BIN / "snakemake"), "--profile", "profiles/slurm",
                                f"{panel}/generation.json", f"{panel}/scores.json"],
                               cwd=project, env=slurm_env(), stdout=log, stderr=subprocess.STDOUT, text=True)
        try:
            killed = _fail_stop(project, run, timeout_s=900)
            rc = run.wait(timeout=900)
        finally:
            if run.poll() is None:
                run.terminate()  # snakemake cancels its Slurm jobs
                run.wait(timeout=60)
    assert rc == 0, (project / "snakemake.log").read_text()[-6000:]
    killed["left"] = _outlived(killed["job"], 20)  # the job has ended: Snakemake saw it finish
    return project / panel, killed


def _job_processes(job: str) -> list[int]:
    """Live processes of Slurm job ``job`` (``SLURM_JOB_ID`` in their environment)."""
    out = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            env = (proc / "environ").read_bytes().split(b"\0")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if f"SLURM_JOB_ID={job}".encode() in env and state not in ("Z", "X"):
            out.append(int(proc.name))
    return out


def _outlived(job: str, limit_s: float) -> list[int]:
    """Processes of ``job`` still alive ``limit_s`` seconds after it ended (none, once they are gone)."""
    deadline = time.monotonic() + limit_s
    while (left := _job_processes(job)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


def test_a_two_node_job_spreads_its_tasks_over_both_nodes(two_node_panel: tuple[Path, dict]) -> None:
    """Issue 27 item 2: one Parsl pool per node (srun), one worker per granted GPU on
    each; both nodes did work and every record names its host and physical GPU."""
    panel, killed = two_node_panel
    gen, scores = _panel_records(panel, "records"), _panel_records(panel, "scores")
    assert {r["worker"]["slurm_job"] for r in gen + scores} == {killed["job"]}  # one job, two nodes
    slots = {(r["worker"]["host"], r["worker"]["gpu_index"]) for r in gen + scores}
    assert {h for h, _ in slots} == {"pf-node1", NODE2}, slots
    assert slots <= {(h, g) for h in ("pf-node1", NODE2) for g in ("0", "1")}, slots
    tel = json.loads((panel.parent.parent / "study/telemetry/fleet.json").read_text())
    assert tel["allocation"]["nodes"] == 2 and tel["allocation"]["nodelist"] == "pf-node[1-2]", tel["allocation"]


def test_a_killed_node_pool_is_retried_on_the_other_node_without_losing_or_duplicating(
        two_node_panel: tuple[Path, dict]) -> None:
    """Fail-stop: the node-2 pool and its workers were SIGKILLed mid-job. Parsl notices
    the lost manager (heartbeat threshold), retries its tasks on node 1's workers, and
    the job ends with every candidate generated and scored exactly once."""
    panel, killed = two_node_panel
    gen, scores = _panel_records(panel, "records"), _panel_records(panel, "scores")
    for records in (gen, scores):
        ids = [r["candidate"]["candidate_id"] for r in records]
        assert len(ids) == 48 and len(set(ids)) == 48  # smoke: 4 prompts x 2 seeds x 6 arms (2 iso-compute)
    manifest = json.loads((panel / "generation.json").read_text())
    assert len(manifest["files"]) == 48
    assert killed["in_flight"], killed
    by_task = {}
    for r in gen + scores:
        by_task.setdefault(f"{r['candidate']['arm']}/{r['candidate']['prompt_id']}-s{r['candidate']['seed']}",
                           []).append(r["worker"])
    for task in killed["in_flight"]:  # what node 2 was doing when it died was finished on node 1
        workers = by_task[task]
        assert any(w["host"] == "pf-node1" for w in workers), (task, workers)
    later = [r for r in gen + scores if r["worker"]["host"] == NODE2 and r["worker"]["pid"] not in killed["pids"]]
    assert not later, later  # nothing ran on node 2 after its pool died


def test_a_killed_node_pool_is_recorded_warned_swept_and_leaves_no_process(two_node_panel: tuple[Path, dict]) -> None:
    """Issue 38 (faults): the lost attempts of node 2's killed pool are retried spans
    (``retried_s`` > 0), each said in one WARNING in the job's log (lost on node 2, redone
    on node 1, its cost); the killed writers' temps are gone, and no process of the job
    (``SLURM_JOB_ID`` in its environment) was left 20 s after it ended."""
    panel, killed = two_node_panel
    tel = json.loads((panel.parent.parent / "study/telemetry/fleet.json").read_text())
    lost = [s for s in tel["spans"] if s.get("lost")]
    assert tel["job"]["retried_s"] > 0 and lost and {s["host"] for s in lost} == {NODE2}, lost
    log = (panel.parent.parent / "logs/fleet/study.log").read_text()
    warned = [line for line in log.splitlines() if "WARNING" in line and " was lost on " in line]
    assert len(warned) == len(lost) and all(f"on {NODE2}/" in w and "redone on pf-node1/" in w and "slot-s" in w
                                            for w in warned), warned
    assert not list(panel.rglob(".tmp-*")), list(panel.rglob(".tmp-*"))
    assert not killed["left"], killed["left"]


def test_the_two_node_fleet_job_is_in_the_ledger_at_slurm_s_figures_with_its_retries(
        two_node_panel: tuple[Path, dict]) -> None:
    """Issue 38 item 1 (study mode): the fleet job, four GPUs over two nodes, at Slurm's
    GPU-seconds; the attempts lost with node 2's pool are its ``retried`` time."""
    panel, killed = two_node_panel
    mine = _check_ledger_against_slurm(panel.parent.parent.parent.parent)
    (fleet,) = mine.values()
    assert fleet["rule"] == "fleet_study" and fleet["held"]["gpus"] == 4 and fleet["held"]["nodes"] == 2
    assert sum(r["slot_s"] for r in fleet["rows"] if r["kind"] == "retried") > 0, fleet["rows"]


def test_a_step_of_a_multi_node_job_asks_slurm_for_the_job_s_nodes_only_inside_a_step() -> None:
    """Issue 27 item 2: a rule runs in an ``srun -n1`` step whose environment shows one
    node; ``whole_job`` reads the job's node count from scontrol only there. In a batch
    script (SLURM_JOB_NUM_NODES set) or outside a step it returns what the environment says,
    without calling Slurm (these environments name a job no controller knows)."""
    from pairflow.fleet.sites.slurm import allocation, whole_job

    batch = {"SLURM_JOB_ID": "999999", "SLURM_JOB_NUM_NODES": "2", "SLURM_STEP_ID": "0"}
    assert whole_job(allocation(batch), batch).nodes == 2  # type: ignore[union-attr]
    no_step = {"SLURM_JOB_ID": "999999", "SLURM_NNODES": "1"}
    assert whole_job(allocation(no_step), no_step).nodes == 1  # type: ignore[union-attr]
    assert whole_job(None, {}) is None
