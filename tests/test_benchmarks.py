"""benchmarks: every section of benchmarks/run.py still runs (--quick), and the report
renders from what it wrote. Figures are not asserted: speed is measured, not tested."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

pytestmark = pytest.mark.slow


def test_every_section_runs_quick_and_the_report_renders(tmp_path: Path) -> None:
    import run  # benchmarks/run.py

    out = tmp_path / "results.json"
    sections = [s for s in run.SECTIONS if s != "cost"]  # two whole studies: its own test below
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run.py"), *sections, "--quick", "--out", str(out),
                           "--scratch", str(tmp_path / "no-study")], capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    results = json.loads(out.read_text())
    assert results["quick"] is True
    for name in sections:  # each wrote its figures, or why it could not run here
        assert isinstance(results[name], dict) and results[name]["section_s"] >= 0
        assert len(results[name]) > 1, name
    assert results["e2e"]["skipped"].startswith("no study run")
    for point in results["payload"]["points"].values():
        assert point["new_bytes"] < point["old_bytes"]
    plan = results["plan"]["points"]["quick"]
    assert plan["outputs"] > 0 and plan["evidence_files"] > 0
    assert plan["noop_rerun_planned_jobs"] == 0  # the finished tree it writes is valid evidence: nothing to redo
    archive = results["archive"]["points"]["quick"]
    # every file of the snapshot: three packs a panel and at most STUDY_FILES (16) others, whatever the panels
    assert archive["packed"]["files"] - 3 * archive["panels"] <= 16 < archive["plain"]["files"] - 3 * archive["panels"]
    assert archive["packed"]["panel_packs"] == 3 * archive["panels"]
    assert archive["packed"]["bytes"] < archive["plain"]["bytes"]
    md = tmp_path / "B.md"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "render.py"), "--results", str(out), "--out", str(md),
                    "--gpu", str(tmp_path / "none.json")], check=True, capture_output=True, timeout=60)
    text = md.read_text()
    assert "quick mode" in text and "## Task payload" in text and "## Planning large studies" in text
    assert "## Archive: packed against plain snapshots" in text


def test_each_section_is_its_own_module_behind_run() -> None:
    """Issue 24: one module per section (``benchmarks/sections/<name>.py``; ``hash`` is
    ``hashing``), every one of them a section of run.py's one command."""
    import run  # benchmarks/run.py

    modules = {p.stem for p in (ROOT / "benchmarks" / "sections").glob("*.py")} - {"__init__", "common"}
    assert {fn.__module__ for fn in run.SECTIONS.values()} == {f"sections.{m}" for m in modules}
    for name, fn in run.SECTIONS.items():
        assert fn.__module__ == f"sections.{'hashing' if name == 'hash' else name}", name
    assert len((ROOT / "benchmarks" / "run.py").read_text().splitlines()) < 150  # the command, not the sections


def test_gpu_check_reports_the_driver_the_wheel_needs_before_measuring(tmp_path: Path) -> None:
    """Issue 25 item 6: on a machine without CUDA the check stops at once, exit 2, and
    its JSON (and the rendered section) says why and which driver the wheel needs."""
    import json
    import subprocess
    import sys

    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the check would run the study")
    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "gpu_check.json"
    proc = subprocess.run([sys.executable, str(root / "benchmarks" / "gpu_check.py"), "--out", str(out)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2, proc.stderr
    g = json.loads(out.read_text())
    assert g["driver_check"]["ok"] is False and g["complete"] is False
    if torch.version.cuda and torch.version.cuda.startswith("13"):
        assert g["driver_check"]["driver_needed"] == "R580+" and "R580+" in g["driver_check"]["why"]
    md = tmp_path / "B.md"
    subprocess.run([sys.executable, str(root / "benchmarks" / "render.py"), "--gpu", str(out), "--out", str(md)],
                   check=True, capture_output=True, timeout=120)
    assert f"Not measured: {g['driver_check']['why']}" in md.read_text()


def test_a_study_that_overruns_is_stopped_and_its_log_kept(tmp_path: Path) -> None:
    """The check's study runner kills the whole Snakemake session on overrun (real
    Snakemake, a rule that sleeps) and returns None, leaving the log for the JSON."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from gpu_check import run_study

    (tmp_path / "Snakefile").write_text('rule all:\n    shell: "echo started; sleep 60"\n')
    (tmp_path / "profiles" / "local").mkdir(parents=True)
    (tmp_path / "profiles" / "local" / "config.yaml").write_text("cores: 1\n")
    log = tmp_path / "snake.log"
    rc, wall = run_study(tmp_path, dict(__import__("os").environ), 8, log)
    assert rc is None and 8 <= wall < 40
    assert "started" in log.read_text()


def test_a_render_keeps_the_sections_written_by_hand() -> None:
    """render.py rewrites the sections it renders in their places and keeps every other
    section of BENCHMARKS.md (planning, the archive, ... are written from their own raw files)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from render import keep_hand_sections, owned_stems

    existing = "# B\n\nold intro\n\n## Hand one\n\nkept 1\n\n## Rendered\n\nold figure\n\n## Hand two\n\nkept 2\n"
    rendered = "# B\n\nnew intro\n\n## Rendered\n\nnew figure\n\n## Only rendered\n\nadded\n"
    owned = frozenset({"Rendered", "Only rendered", "On a GPU"})
    out = keep_hand_sections(rendered, existing, owned)
    assert out == ("# B\n\nnew intro\n\n## Hand one\n\nkept 1\n\n## Rendered\n\nnew figure\n\n## Hand two\n\nkept 2\n\n"
                   "## Only rendered\n\nadded\n")
    assert keep_hand_sections(rendered, "", owned) == rendered
    # A heading whose detail changed (a GPU run) replaces its section, never sits beside it.
    gpu = keep_hand_sections("# B\n\n## On a GPU (`gpu_check.sh`)\n\nH200\n", "# B\n\n## On a GPU\n\nnot yet\n\n"
                             "## Hand\n\nkept\n", owned)
    assert gpu == "# B\n\n## On a GPU (`gpu_check.sh`)\n\nH200\n\n## Hand\n\nkept\n"
    # The real file's owned stems are read from render.py's own headings.
    assert {"On a GPU", "Metrics on this CPU", "Writer vs bare ffmpeg at the default size and 480p"} <= owned_stems()


def test_the_fork_probe_answers_with_the_worker_s_own_error_where_there_is_no_gpu(tmp_path: Path) -> None:
    """benchmarks/fork_cuda_probe.py (run by gpu_check.sh): a worker forked from a fork
    server that preloaded pairflow.fleet.preload reports what it saw; without a GPU the answer is
    torch's own error, not a hang or a traceback."""
    root = Path(__file__).resolve().parent.parent
    out = tmp_path / "fork.json"
    proc = subprocess.run([sys.executable, str(root / "benchmarks" / "fork_cuda_probe.py"), "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["preloaded"] == ["diffusers", "pyiqa", "torch"]  # forked from the preloaded server
    if not __import__("torch").cuda.is_available():
        assert result["ok"] is False
        assert "NVIDIA" in result["error"] or "CUDA" in result["error"]


COST_LINE = r"cost: marginal/floor -?\d+\.\d\d fixed -?\d+\.\d CPU-s"


def test_cost_arithmetic_line_prompts_and_the_floor_of_one_candidate(tmp_path: Path) -> None:
    """Issue 37, the cheap pieces of the ``cost`` section: marginal and fixed cost from two
    runs' figures, the summary line, new prompts per run (deterministic), the study
    project it runs, and the floor measured on one candidate in this process."""
    import re

    import yaml
    from sections import cost

    marginal, fixed = cost.split(100.0, 56, 400.0, 224)  # 300 CPU-s more for 168 candidates more
    assert marginal == pytest.approx(300 / 168) and fixed == pytest.approx(0.0, abs=1e-9)
    marginal, fixed = cost.split(83.3, 16, 91.2, 32)
    assert marginal == pytest.approx(7.9 / 16) and fixed == pytest.approx(83.3 - 16 * 7.9 / 16)
    assert cost.line(1.5, 75.46, 0.5) == "cost: marginal/floor 3.00 fixed 75.5 CPU-s"
    assert re.fullmatch(COST_LINE, cost.line(marginal, fixed, 0.18))
    rows = cost.prompt_rows(5, "k4sm")
    assert rows == cost.prompt_rows(5, "k4sm") and len({t for _, t in rows}) == 5
    assert not {t for _, t in rows} & {t for _, t in cost.prompt_rows(5, "k1sm")}  # another run: new prompts
    # what each process of a study is, and the job it works for (a detached worker pool by its run folder)
    py = sys.executable
    assert cost.kind_of([py, "-m", "pairflow.fleet.orphans", "exec", "7", py, "/v/interchange.py"]) == "parsl interchange"
    assert cost.kind_of([py, "-m", "pairflow.fleet.orphans", "exec", "7", "/v/interchange.py"]) == "parsl interchange"
    assert cost.kind_of([py, "/p/.snakemake/scripts/tmpa_b1.timed_pass.py"]) == "timed_pass"
    pool = [py, "-m", "pairflow.fleet.workerpool", "--logdir=/p/results/scratch/panels/smoke/run/generate-score/workers"]
    assert cost.kind_of(pool) == "parsl worker pool (manager)"
    assert cost.rule_of(pool, cost.kind_of(pool), None) == "generate_score_panel"
    assert cost.rule_of(pool, cost.kind_of(pool), "timed_pass") == "timed_pass"  # its parent's, when seen
    base = cost.base_prompts(cost.base_config())
    assert base == {"smoke": 4, "motion": 3}  # config/panels/*.tsv
    model = cost.model_source(tmp_path)
    proj = cost.study_project(tmp_path / "x2", 2, {"smoke": 1, "motion": 1}, model)
    cfg = yaml.safe_load((proj / "config" / "config.yaml").read_text())
    assert cfg["study"] == "cost-2x" and cfg["arms"] == cost.base_config()["arms"]
    assert cfg["generation"] == cost.base_config()["generation"] and cfg["storage"]["scratch"] == "results/scratch"
    study = cost.load(proj)
    from pairflow.plan.candidates import candidates

    cands = [c for p in study.panels for c in candidates(study, p)]
    assert len(cands) == 2 * 2 * 2 * 4  # panels x prompts x seeds x arms
    control = cands[0]
    assert control.arm.is_control
    floor = cost.measure_floor(study, [control], [control], tmp_path / "floor")
    assert floor["candidates"] == 1 and 0 < floor["per_candidate_cpu_s"] < 30
    assert set(floor["per_phase_cpu_s"]) == {"generate", "encode", "decode", "score"}
    assert floor["per_phase_cpu_s"]["encode"] > 0  # ffmpeg's CPU (a child) is counted
    assert not list((tmp_path / "floor").iterdir())  # its videos are removed as it goes


def test_cost_counts_the_cpu_of_processes_that_leave_their_parent(tmp_path: Path) -> None:
    """Issue 37: ``run_counted`` as a child subreaper counts a detached grandchild's CPU
    (a daemon that outlives the command it ran under, as Parsl's worker pools do), waits
    for it, and kills only what lingers past its bound. Run in a child process: the test
    process must not become a subreaper."""
    script = f"""
import json, sys
sys.path.insert(0, {str(ROOT / "benchmarks")!r})
from pathlib import Path
from sections import cost
assert cost.become_subreaper()
burn = "import time\\nt = time.process_time()\\nwhile time.process_time() - t < 1.0: pass"
spin = "import time\\nwhile True: time.sleep(0.05)"
cmd = f"(setsid {{sys.executable}} -c '{{burn}}' &) ; (setsid {{sys.executable}} -c '{{spin}}' &) ; exit 0"
r = cost.run_counted(["sh", "-c", cmd], Path({str(tmp_path)!r}), Path({str(tmp_path / "log")!r}), linger_s=4,
                     interval=0.2)
print(json.dumps(r))
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["rc"] == 0
    assert r["cpu_s"] >= 1.0  # the detached burner's second, reaped here
    assert r["sampled"]["cpu_s"] <= r["cpu_s"] + 0.05  # the sampler is a lower bound
    assert len(r["killed_lingering"]) == 1 and "python" in r["killed_lingering"][0]["kind"]  # the spinner
    assert r["wall_incl_reaping_s"] >= 4


def test_cost_section_quick_runs_both_studies_and_renders(tmp_path: Path) -> None:
    """Issue 37: ``run.py cost --quick`` runs the floor and the default study's first
    prompt per panel at 1x and 2x through Snakemake, every process reaped, and ends with
    the summary line; its section renders."""
    import re

    out = tmp_path / "results.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run.py"), "cost", "--quick", "--out", str(out)],
                          capture_output=True, text=True, timeout=1200, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert re.fullmatch(COST_LINE, proc.stdout.strip().splitlines()[-1])
    c = json.loads(out.read_text())["cost"]
    assert c["subreaper"] is True and c["multiples"] == [1, 2] and c["history"] == []  # quick runs are not kept
    r1, r2 = c["runs"]["1x"], c["runs"]["2x"]
    assert (r1["candidates"], r2["candidates"]) == (16, 32)
    for r in (r1, r2):
        assert r["killed_lingering"] == []  # every process of the study ended by itself
        assert 0.5 * r["cpu_s"] <= r["sampled"]["cpu_s"] <= r["cpu_s"] * 1.02  # cross-check: a lower bound
        assert {"generate_score_panel", "timed_pass", "snakemake"} <= set(r["sampled"]["cpu_s_by_rule"])
        assert r["jobs"]["generate_score_panel"]["jobs"] == 2
    assert c["line"] == proc.stdout.strip().splitlines()[-1]
    assert c["fixed_cpu_s"] == pytest.approx(r1["cpu_s"] - 16 * c["marginal_cpu_s"])
    md = tmp_path / "B.md"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "render.py"), "--results", str(out), "--out", str(md),
                    "--gpu", str(tmp_path / "none.json")], check=True, capture_output=True, timeout=60)
    text = md.read_text()
    assert "## Cost per candidate (issue 37)" in text and "to be measured on a quiet machine" in text
