"""Planning at scale, before against after, side by side on one synthetic tree (issue 27
item 5): ``.venv/bin/python benchmarks/plan_bench.py --panels 1613 --before <rev>``.

For each code version (``--before``: a git revision, checked out into a temporary folder;
the current tree is "after") it measures, on the same project and the same finished
tree (``sections.plan._finish``: valid evidence written directly, with the vouchers a real run's
jobs write beside their manifests, ``pairflow.records.vouch``):

* dry run over the empty tree (``snakemake -n``);
* first plan after a finished run (a real ``snakemake`` over the finished tree, no
  plan-time memo yet: ``scratch/checks/evidence.json`` is removed before it);
* no-op rerun (``snakemake -n`` after it, the memo written).

Each figure comes with wall seconds, CPU seconds (user + system of the Snakemake process:
what the load of other users does not inflate), peak RSS and the 1-minute load average
before and after. Also measured: Snakemake's own floor, a Snakefile with as many jobs and
trivial input functions (``--floor``), and the Slurm executor plugin's start-up probe.
``--allocation study`` measures a project of ``fleet.allocation: study``; ``--keep DIR``
writes the finished tree into DIR once and reuses it in later runs (writing it takes
minutes at 100k). Writes ``benchmarks/plan_bench.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "workflow"))

from sections.common import scale_project  # noqa: E402  (the plan section's project and tree factories)
from sections.plan import _finish, _slurm_probe_s  # noqa: E402

SNAKE = str(Path(sys.executable).with_name("snakemake"))


def timed(cmd: list[str], cwd: Path) -> dict[str, Any]:
    """Wall and CPU seconds, peak RSS (MiB) and the load average around one command."""
    load0 = os.getloadavg()[0]
    t = time.perf_counter()
    proc = subprocess.run(["/usr/bin/time", "-f", "%M %U %S", *cmd], cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if proc.returncode:
        raise RuntimeError(proc.stderr[-3000:])
    rss, user, sys_ = proc.stderr.strip().splitlines()[-1].split()
    return {"s": round(wall, 2), "cpu_s": round(float(user) + float(sys_), 2), "peak_rss_mib": round(int(rss) / 1024),
            "load": [round(load0, 2), round(os.getloadavg()[0], 2)],
            "nothing_to_do": "Nothing to be done" in proc.stdout + proc.stderr}


def use_code(proj: Path, code: Path) -> None:
    """Point ``proj`` at the workflow of ``code`` (a checkout)."""
    for name in ("Snakefile", "workflow"):
        target = proj / name
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()
        src = code / name
        shutil.copytree(src, target, ignore=shutil.ignore_patterns("__pycache__")) if src.is_dir() \
            else shutil.copy(src, target)


def checkout(rev: str) -> Path:
    out = Path(tempfile.mkdtemp(prefix="plan-before-"))
    archive = subprocess.run(["git", "archive", rev, "Snakefile", "workflow"], cwd=ROOT, check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive, check=True)
    return out


def floor(panels: int) -> dict[str, Any]:
    """Snakemake alone: a Snakefile with one job per panel plus a study job, the same
    number of input functions per panel job (five) returning fixed strings, no config
    parsing, no evidence check."""
    proj = Path(tempfile.mkdtemp(prefix="plan-floor-"))
    (proj / "Snakefile").write_text(f'''
PANELS = [f"p{{i:04d}}" for i in range({panels})]
def f(wildcards):
    return []
def sheet(wildcards):
    return "sheet.txt"
rule all:
    input: "study.json"
rule study:
    input: expand("panels/{{panel}}/scores.json", panel=PANELS)
    output: "study.json"
    shell: "touch {{output}}"
rule panel:
    input: model=f, arms=f, sheet=sheet, heal_generation=f, heal_scores=f
    output: generation="panels/{{panel}}/generation.json", scores="panels/{{panel}}/scores.json"
    params: digest=lambda w: w.panel
    shell: "touch {{output}}"
''')
    (proj / "sheet.txt").write_text("x\n")
    out = timed([SNAKE, "-n", "--cores", "2", "--quiet", "all"], proj)
    shutil.rmtree(proj)
    return out


def memo_path(proj: Path) -> Path:
    """The plan-time memo of ``proj``'s study (removed before each first plan)."""
    import yaml

    from pairflow.layout import Layout
    from pairflow.plan.config import study_from_raw

    raw = yaml.safe_load((proj / "config" / "config.yaml").read_text())
    return Layout(study_from_raw(raw, proj, source="benchmark").scratch).evidence_memo


def finished_project(panels: int, allocation: str, keep: str | None) -> tuple[Path, dict[str, Any]]:
    """A project with a finished tree (``_finish``): written into a new temporary folder,
    or, with ``keep``, into ``keep`` once and reused by later runs with the same panels and
    allocation (``finished.json`` there records what it holds; this checkout's workflow is
    copied in each time)."""
    if keep is None:
        proj = scale_project(panels, 31, allocation)
    else:
        proj = Path(keep).resolve()
        marker = proj / "finished.json"
        if marker.exists():
            done = json.loads(marker.read_text())
            if (done["panels"], done["allocation"]) != (panels, allocation):
                raise SystemExit(f"{keep} holds a tree of {done['panels']} panels ({done['allocation']}), "
                                 f"not {panels} ({allocation}): name another --keep folder")
            use_code(proj, ROOT)
            return proj, done["tree"]
        if proj.exists() and any(proj.iterdir()):
            raise SystemExit(f"{keep} exists and holds no finished tree (no finished.json): remove it or name "
                             "another --keep folder")
        scale_project(panels, 31, allocation, proj)
    outs, files, write_s = _finish(proj, SNAKE)
    tree = {"outputs": len(outs), "evidence_files": files, "write_tree_s": round(write_s, 1)}
    if keep is not None:
        (proj / "finished.json").write_text(json.dumps({"panels": panels, "allocation": allocation, "tree": tree}))
    return proj, tree


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--panels", type=int, default=500, help="panels of 31 prompts x 1 seed x 2 arms")
    ap.add_argument("--allocation", choices=("per-panel", "study"), default="per-panel",
                    help="the project's fleet.allocation")
    ap.add_argument("--keep", help="folder for the finished tree: written once, reused by later runs "
                                   "(the dry run still runs on a fresh project)")
    ap.add_argument("--before", help="git revision to compare against (side by side)")
    ap.add_argument("--floor", action="store_true", help="also measure Snakemake's own floor")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "plan_bench.json"), help="where the figures go")
    args = ap.parse_args()
    versions = {"after": ROOT}
    if args.before:
        versions = {"before": checkout(args.before), **versions}
    empty = scale_project(args.panels, 31, args.allocation)
    res: dict[str, Any] = {"candidates": args.panels * 31 * 2, "panels": args.panels, "allocation": args.allocation,
                           "cpus": os.cpu_count(), "slurm_probe_s": _slurm_probe_s(), "versions": {}}
    for name, code in versions.items():
        use_code(empty, code)
        res["versions"][name] = {"dry_run": timed([SNAKE, "-n", "--cores", "2", "--quiet", "all"], empty)}
        print(name, "dry", res["versions"][name]["dry_run"], flush=True)
    shutil.rmtree(empty)
    proj, tree = finished_project(args.panels, args.allocation, args.keep)
    res.update(tree)
    memo = memo_path(proj)
    for name, code in versions.items():
        use_code(proj, code)
        memo.unlink(missing_ok=True)
        first = timed([SNAKE, "--cores", "2", "all"], proj)
        noop = timed([SNAKE, "-n", "--cores", "2", "all"], proj)
        res["versions"][name].update({"first_plan": first, "noop": noop})
        print(name, "first", first, "noop", noop, flush=True)
    use_code(proj, ROOT)
    if args.floor:
        res["snakemake_floor_dry_run"] = floor(args.panels)
        print("floor", res["snakemake_floor_dry_run"], flush=True)
    if args.keep is None:
        shutil.rmtree(proj)
    for code in versions.values():
        if code != ROOT:
            shutil.rmtree(code)
    Path(args.out).write_text(json.dumps(res, indent=1) + "\n")

if __name__ == "__main__":
    main()
