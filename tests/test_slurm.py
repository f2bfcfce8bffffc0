"""The default study through ``snakemake --profile profiles/slurm`` on a real Slurm.

Needs a running cluster (``bash .ci/slurm-up`` starts a single-node one on loopback
with two fake GPUs). Skipped where ``sinfo`` gets no answer, unless
``PAIRFLOW_REQUIRE_SLURM=1`` (set by ``.ci/run``), which turns the skip into a failure.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, copy_project

from pairflow.slurm import cluster_unavailable

pytestmark = pytest.mark.slow
BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def slurm() -> None:
    why = cluster_unavailable()
    if why is not None:
        if os.environ.get("PAIRFLOW_REQUIRE_SLURM") == "1":
            pytest.fail(f"PAIRFLOW_REQUIRE_SLURM=1 but {why}")
        pytest.skip(why)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env['PATH']}"
    env.pop("SLURM_CONF", None)  # jobs read /etc/slurm/slurm.conf (the plugin strips SLURM_CONF)
    return env


@pytest.fixture(scope="module")
def slurm_study(slurm, tmp_path_factory) -> Path:  # type: ignore[no-untyped-def]
    """The shipped default config and Slurm profile, unchanged, in a fresh project copy."""
    project = copy_project(tmp_path_factory.mktemp("slurm") / "project")
    shutil.copytree(ROOT / "config", project / "config")
    run = subprocess.run([str(BIN / "snakemake"), "--profile", "profiles/slurm"], cwd=project, env=_env(),
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
    assert len(gen) == 56  # 2 panels: (4 + 3 prompts) x 2 seeds x 4 arms
    jobs = {r["worker"]["slurm_job"] for r in gen}
    assert None not in jobs and len(jobs) == 2  # one Slurm job per panel
    # ... which also scored it (fleet.panel_jobs: combined, the default): same job, same workers
    assert {r["worker"]["slurm_job"] for r in _records(slurm_study, "scores")} == jobs
    # Physical slot, logical device and stream are three different things, all recorded.
    slots = {(r["worker"]["host"], r["worker"]["gpu_index"]) for r in gen}
    assert len(slots) == 2, slots  # two distinct GPU slots (the fake gres /dev/null, /dev/zero)
    assert {r["worker"]["device"] for r in gen} == {"cpu"}  # torch sees no CUDA behind the fake gres
    assert len({r["candidate"]["stream_seed"] for r in gen}) == 14  # one stream per pair, shared by its arms


def test_timed_pass_ran_alone(slurm_study: Path) -> None:
    timings = _records(slurm_study, "timing")
    assert len(timings) == 56
    nodes = {json.dumps(t["worker"]["node"], sort_keys=True) for t in timings}
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


def test_one_allocation_packs_a_worker_per_gpu(slurm, tmp_path: Path) -> None:
    """``pairflow probe-slots`` in an sbatch job with two GPUs: srun starts the pool, Parsl
    pins one worker to each granted GPU, and every no-op task runs on one of them."""
    out = tmp_path / "probe.json"
    cmd = f"{BIN / 'pairflow'} probe-slots --tasks 200 --out {out}"
    run = subprocess.run(["sbatch", "--wait", "--quiet", "--gres=gpu:2", "--cpus-per-task=2", "--time=10",
                          f"--output={tmp_path / 'probe.log'}", "--wrap", cmd], env=_env(),
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
    from pairflow.slurm import allocation

    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_START_TIME": "1700000000"}
    assert allocation(env).start == 1700000000.0  # type: ignore[union-attr]
    assert allocation({"SLURM_JOB_ID": "7"}).start is None  # type: ignore[union-attr]
