"""The ``cost`` section of ``benchmarks/run.py`` (issue 37): what a candidate costs the
whole study in CPU seconds, against the floor, what it cannot cost less than.

Floor: per candidate CPU seconds in one warm process (imports and model loads paid
before, in a warm-up) doing exactly what a candidate must: the plain generation of its
arm (``armrun.run_arm`` on ``arm_pipeline``, a search arm's candidates and verifier
scorings included), the fixed-recipe encode (``media.video.encode``, real ffmpeg) and
decode (``read_video``), and its scores with the study's scorers (``metrics.score``,
FR metrics against the pair's control). CPU = this process's and its children's
(ffmpeg) user + system time, ``getrusage`` deltas.

Study: ``snakemake --profile profiles/local`` on the default study (config/config.yaml:
same arms, seeds, generation, encoder, scorers, fleet) at 1x and at k x its prompts, each
with new prompts (written deterministically) and fresh storage under a temporary
project. Every process counts: this process becomes a child subreaper
(``PR_SET_CHILD_SUBREAPER``) before starting Snakemake, so orphans and daemons (Parsl's
interchange, managers, fork server and workers; ffmpeg) are reparented to it; after
Snakemake exits every remaining descendant is reaped (lingering ones waited for a
bounded time, then killed and reported), and the study's CPU is the
``RUSAGE_CHILDREN`` delta. A /proc sampler (once a second, last seen user + system of
every descendant: a lower bound, it misses short processes and each one's last second)
cross-checks it and splits it by kind of process. Snakemake's per-job benchmark files
(``cpu_time``, psutil samples: also a lower bound) split it by rule.

marginal = (CPU_k - CPU_1) / (candidates_k - candidates_1); fixed = CPU_1 - candidates_1 x
marginal; R = marginal / floor: how many floors a candidate costs the study.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import yaml

from .common import ROOT

PR_SET_CHILD_SUBREAPER = 36

SUBJECTS = ("a heron", "a red kite", "an old tram", "a sailboat", "a lantern", "a fox cub", "a glacier",
            "a kite surfer", "a windmill", "a snail", "a street market", "a waterfall", "a paper crane",
            "a bumblebee", "a steam train", "a jellyfish", "a skateboarder", "a hot-air balloon")
ACTIONS = ("drifting slowly", "turning in the wind", "crossing the frame", "glinting in the light",
           "moving through fog", "spinning in place", "rising and falling", "passing quickly")
PLACES = ("over a frozen lake", "in a narrow alley", "above a wheat field", "beside a harbour wall",
          "under a stormy sky", "at the edge of a forest", "on a neon-lit street", "across a desert dune")


def prompt_rows(n: int, tag: str) -> list[tuple[str, str]]:
    """``n`` prompt rows (id, text), the same for the same ``tag``, new for a new one: the
    words are picked by the sha256 of (tag, row), and the text ends with its tag and row,
    so no two runs share a prompt (nor a candidate id)."""
    rows = []
    for j in range(n):
        h = hashlib.sha256(f"{tag}/{j}".encode()).digest()
        text = (f"{SUBJECTS[h[0] % len(SUBJECTS)]} {ACTIONS[h[1] % len(ACTIONS)]} {PLACES[h[2] % len(PLACES)]}, "
                f"take {tag}.{j}")
        rows.append((f"{tag}{j:03d}", text))
    return rows


def base_config() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "config" / "config.yaml").read_text())


def base_prompts(cfg: dict[str, Any]) -> dict[str, int]:
    """Prompts per panel of the default study (its sheets' rows)."""
    return {name: len((ROOT / p["sheet"]).read_text().strip().splitlines()) - 1 for name, p in cfg["panels"].items()}


WORKFLOW_FILES = ("Snakefile", "workflow", "envs", "profiles")


def snapshot(dest: Path) -> Path:
    """This checkout's workflow (``WORKFLOW_FILES``) copied once, so both studies of a run
    use the same code however the checkout changes meanwhile (``study_env`` points their
    imports at it)."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in WORKFLOW_FILES:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy(src, dest / name)
    return dest


def study_project(where: Path, multiple: int, base: dict[str, int], model: Path, tree: Path | None = None) -> Path:
    """A copy of ``tree`` (default: this checkout) in ``where`` with the default config, its study
    named ``cost-<multiple>x``, storage inside the project, and per panel ``multiple`` x
    ``base[panel]`` new prompts (``prompt_rows``); the embedded model copied from ``model``
    (mtimes kept), as the main job finds it after its first run."""
    if tree is None:
        snapshot(where)
    else:
        shutil.copytree(tree, where, dirs_exist_ok=True)
    cfg = base_config()
    cfg["study"] = f"cost-{multiple}x"
    cfg["storage"] = {"scratch": "results/scratch", "work": "results/work"}
    (where / "config" / "panels").mkdir(parents=True)
    for name, panel in cfg["panels"].items():
        rows = prompt_rows(multiple * base[name], f"k{multiple}{name[:2]}")
        (where / "config" / "panels" / f"{name}.tsv").write_text(
            "prompt_id\tprompt\n" + "".join(f"{i}\t{t}\n" for i, t in rows))
        panel["sheet"] = f"config/panels/{name}.tsv"
    (where / "config" / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    shutil.copytree(model, where / cfg["model"]["path"])  # copy2: mtimes kept
    return where


def model_source(top: Path) -> Path:
    """The embedded model of this checkout (resources/), or one built in ``top`` when the
    checkout has none yet (a fresh clone)."""
    cfg = base_config()
    if cfg["model"]["kind"] != "embedded-tiny":
        raise RuntimeError("the cost section runs the default study, whose model is embedded-tiny")
    model = ROOT / cfg["model"]["path"]
    if (model / "model_index.json").exists():
        return model
    from pairflow.stages.steps import build_model

    build_model(top / "model")
    return top / "model"


def load(proj: Path) -> Any:
    from pairflow.plan.config import load_study

    return load_study(proj / "config" / "config.yaml", proj)


def cpu_now() -> float:
    """User + system seconds of this process and of its reaped children (ffmpeg)."""
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


# ---------------------------------------------------------------------------------------
# The floor


class Floor:
    """One warm process doing a candidate's work and nothing else (see the module doc)."""

    def __init__(self, study: Any, out: Path) -> None:
        import torch

        from pairflow.metrics import ScoreContext
        from pairflow.stages.scoring import clip_precision

        self.study, self.out = study, out
        out.mkdir(parents=True, exist_ok=True)
        torch.set_num_threads(study.generation.threads)
        self.ctx = ScoreContext(mirror=study.weights.mirror, batch=study.scoring.batch, fps=study.generation.fps,
                                device="cpu", clip_precision=clip_precision(study, "cpu"))
        self.refs: dict[tuple[str, str, int], Any] = {}  # the pair's control, decoded BT.709
        self.phases: dict[str, float] = defaultdict(float)

    def warm(self, cands: list[Any]) -> float:
        """Imports, every arm's pipeline, the scorers' models: run ``cands`` (one per arm)
        once, uncounted. Returns the seconds it took."""
        from pairflow.metrics import warm
        from pairflow.stages.scoring import study_weights

        t = time.perf_counter()
        warm(self.study.scorers, self.ctx, study_weights(self.study))
        for c in cands:
            self.one(c)
        self.phases.clear()
        return time.perf_counter() - t

    def one(self, c: Any) -> float:
        """One candidate's work; returns its CPU seconds (phases added to ``self.phases``)."""
        import torch

        from pairflow.arms import verifier_for
        from pairflow.generation import generate as g
        from pairflow.generation.armrun import arm_pipeline, run_arm
        from pairflow.media.frames import prepare_frames
        from pairflow.media.video import encode, read_video
        from pairflow.metrics import score
        from pairflow.plan.candidates import expected_scores
        from pairflow.stages.scoring import metric_decoding

        study, gen, k = self.study, self.study.generation, c.key
        start = last = cpu_now()

        def phase(name: str) -> None:
            nonlocal last
            now = cpu_now()
            self.phases[name] += now - last
            last = now

        pipe = arm_pipeline(c.arm, study.model, gen)  # cached per process: loaded in the warm-up
        tokens = g.text_tokens(pipe, gen)
        r = run_arm(pipe, c.prompt.text, k.stream_seed, c.arm, gen, tokens, count=False,
                    verifier=verifier_for(c.arm, study))
        frames, _ = prepare_frames(r.frames, study.encoder)
        phase("generate")
        path = self.out / f"{k.candidate_id}.mp4"
        info = encode(frames, path, study.encoder, gen.fps)
        phase("encode")
        names = expected_scores(study, c.arm)
        matrices = {n: metric_decoding(study, n) for n in names}
        decoded = {m: read_video(path, study.encoder, frames=info.frames, height=info.height, width=info.width,
                                 fps=gen.fps, matrix=m) for m in sorted(set(matrices.values()) | {"bt709"})}
        phase("decode")
        pair = (k.panel, k.prompt_id, k.seed)
        if c.arm.is_control:
            self.refs[pair] = decoded["bt709"]
        ref = None if c.arm.is_control else self.refs[pair]
        torch.set_num_threads(study.scoring.threads)
        for n in names:
            score(n, decoded[matrices[n]], ref, self.ctx)
        torch.set_num_threads(gen.threads)
        phase("score")
        path.unlink()
        return last - start


def measure_floor(study: Any, cands: list[Any], warm: list[Any], out: Path) -> dict[str, Any]:
    """The floor over ``cands`` (each pair's control first) after ``warm`` ran once."""
    fl = Floor(study, out)
    warm_s = fl.warm(warm)
    t, per_arm = time.perf_counter(), defaultdict(list)
    for c in cands:
        per_arm[c.arm.name].append(fl.one(c))
    total = sum(sum(v) for v in per_arm.values())
    return {"candidates": len(cands), "cpu_s": total, "per_candidate_cpu_s": total / len(cands),
            "wall_s": time.perf_counter() - t, "warm_up_s": warm_s,
            "per_arm_cpu_s": {a: sum(v) / len(v) for a, v in per_arm.items()},
            "per_phase_cpu_s": {p: s / len(cands) for p, s in fl.phases.items()}}


# ---------------------------------------------------------------------------------------
# The whole study


def become_subreaper() -> bool:
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


TICK = os.sysconf("SC_CLK_TCK")


def proc_table() -> dict[int, tuple[int, int, float, str]]:
    """Every process: pid -> (ppid, start time, user + system seconds, state)."""
    table = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            raw = Path(f"/proc/{d}/stat").read_text()
        except OSError:
            continue
        rest = raw[raw.rindex(")") + 2:].split()
        table[int(d)] = (int(rest[1]), int(rest[19]), (int(rest[11]) + int(rest[12])) / TICK, rest[0])
    return table


def descendants(table: dict[int, tuple[int, int, float, str]], root: int, skip: set[int]) -> list[int]:
    """Pids below ``root`` in ``table``, parents before children, none under (nor in) ``skip``."""
    kids: dict[int, list[int]] = defaultdict(list)
    for pid, row in table.items():
        kids[row[0]].append(pid)
    out, todo = [], [k for k in kids[root] if k not in skip]
    while todo:
        p = todo.pop(0)
        out.append(p)
        todo += kids[p]
    return out


def argv_of(pid: int) -> list[str]:
    try:
        return [a.decode(errors="replace") for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
    except OSError:
        return []


MODULE_KINDS = {"pairflow.fleet.workerpool": "parsl worker pool (manager)", "pairflow.fleet.orphans": "orphan watchdog",
                "pairflow.stages.calibworker": "calibration worker"}


def kind_of(argv: list[str]) -> str:
    """What a study process is, from its command line: a rule's job script (the rule's
    name), Snakemake, Parsl's interchange, a worker pool's manager, its fork server and the
    workers forked from it (which keep its command line), ffmpeg, ..."""
    text = " ".join(argv)
    if not argv:
        return "?"
    if "ffmpeg" in Path(argv[0]).name or "ffprobe" in Path(argv[0]).name:
        return "ffmpeg"
    if "multiprocessing.forkserver" in text:
        return "parsl workers (fork server)"
    if "multiprocessing.resource_tracker" in text:
        return "resource tracker"
    if "-m" in argv[:-1]:
        i = argv.index("-m")
        module = argv[i + 1]
        if module == "pairflow.fleet.orphans" and argv[i + 2:i + 3] == ["exec"]:
            return kind_of(argv[i + 4:])  # about to exec the interchange (``orphans.exec_command``)
        return MODULE_KINDS.get(module, module)
    for w in argv:  # argv[0] too: the interchange runs as its own script
        if w.endswith(".py"):  # a job script: Snakemake runs .snakemake/scripts/tmpXXXX.<rule>.py
            name = Path(w).name
            if ".snakemake/scripts/" in w and name.count(".") >= 2:
                return name.split(".", 1)[1][:-3]
            return "parsl interchange" if name == "interchange.py" else name[:-3]
        if Path(w).name == "snakemake":
            return "snakemake"
    return Path(argv[0]).name


STAGE_RULES = {"generate-score": "generate_score_panel", "generate": "generate_panel", "score": "score_panel"}
"""A panel job's run folder (``panels/<panel>/run/<stage>``) and its rule: how a worker
pool that Parsl's provider detached from its job (reparented here) is given its job."""


def rule_of(argv: list[str], kind: str, parent: str | None) -> str:
    """The Snakemake rule a process works for: a job script's own, else its parent's
    (when first seen), else the panel run folder its command line names, else its kind."""
    if any(".snakemake/scripts/" in w for w in argv):
        return kind
    if parent is not None and parent != "snakemake":
        return parent
    for w in argv:
        if "/run/" in w and "/panels/" in w:
            stage = w.split("/run/", 1)[1].split("/", 1)[0]
            return STAGE_RULES.get(stage, stage)
    return kind


class Sampler(threading.Thread):
    """Once a second, the last seen CPU of every descendant of this process (outside
    ``skip``), by (pid, start time), each one's kind (``kind_of``) and rule (``rule_of``)."""

    def __init__(self, skip: set[int], interval: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.skip, self.interval, self.stopped = skip, interval, threading.Event()
        self.seen: dict[tuple[int, int], float] = {}
        self.kinds: dict[tuple[int, int], str] = {}
        self.rules: dict[tuple[int, int], str] = {}

    def sample(self) -> None:
        table = proc_table()
        for pid in descendants(table, os.getpid(), self.skip):
            key = (pid, table[pid][1])
            self.seen[key] = max(self.seen.get(key, 0.0), table[pid][2])
            if key not in self.kinds:
                argv = argv_of(pid)
                self.kinds[key] = kind_of(argv)
                ppid = table[pid][0]
                parent = self.rules.get((ppid, table[ppid][1])) if ppid in table else None
                self.rules[key] = rule_of(argv, self.kinds[key], parent)

    def run(self) -> None:
        while not self.stopped.wait(self.interval):
            self.sample()

    def figures(self) -> dict[str, Any]:
        by_kind: dict[str, float] = defaultdict(float)
        by_rule: dict[str, float] = defaultdict(float)
        for key, cpu in self.seen.items():
            by_kind[self.kinds.get(key, "?")] += cpu
            by_rule[self.rules.get(key, "?")] += cpu
        return {"cpu_s": sum(self.seen.values()), "processes": len(self.seen),
                "cpu_s_by_kind": dict(sorted(by_kind.items(), key=lambda kv: -kv[1])),
                "cpu_s_by_rule": dict(sorted(by_rule.items(), key=lambda kv: -kv[1]))}


def reap(skip: set[int], wait_s: float, tick: Any = None) -> list[dict[str, Any]]:
    """Reap every descendant of this process (outside ``skip``), waiting up to ``wait_s``
    for those still running; then kill those left (all started by the study) and reap
    them. Returns the ones that had to be killed. ``tick``: called every round (the sampler)."""
    me, deadline, killed = os.getpid(), time.monotonic() + wait_s, []
    while True:
        if tick is not None:
            tick()
        table = proc_table()
        below = descendants(table, me, skip)
        ours = [p for p in below if table[p][0] == me]
        for p in ours:
            try:
                os.waitpid(p, os.WNOHANG)
            except ChildProcessError:
                pass
        if not below:
            return killed
        if time.monotonic() > deadline:
            for p in below:
                if table[p][3] != "Z":
                    killed.append({"pid": p, "kind": kind_of(argv_of(p)), "cpu_s": table[p][2]})
                    try:
                        os.kill(p, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            deadline = time.monotonic() + 30
        time.sleep(0.2)


def job_benchmarks(scratch: Path) -> dict[str, dict[str, float]]:
    """Snakemake's benchmark files summed by rule: jobs, wall s, cpu_time s."""
    rules: dict[str, dict[str, float]] = {}
    for tsv in sorted((scratch / "benchmarks").rglob("*.tsv")):
        head, row = (line.split("\t") for line in tsv.read_text().splitlines()[:2])
        rec = dict(zip(head, row, strict=False))
        r = rules.setdefault(tsv.parent.name, {"jobs": 0, "wall_s": 0.0, "cpu_s": 0.0})
        r["jobs"] += 1
        r["wall_s"] += float(rec["s"])
        r["cpu_s"] += float(rec["cpu_time"]) if rec.get("cpu_time", "NA") not in ("NA", "") else 0.0
    return rules


def study_env(proj: Path) -> dict[str, str]:
    """This environment with the package imported from ``proj``'s copy (Snakemake itself
    does, ``common.smk``; its jobs and workers would import the checkout's, which others
    may be editing) instead of what ``common`` added to PYTHONPATH."""
    env = dict(os.environ)
    added = {str(ROOT / "workflow"), str(ROOT / "benchmarks")}
    kept = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in added]
    env["PYTHONPATH"] = os.pathsep.join([str(proj / "workflow"), *kept])
    return env


def run_counted(argv: list[str], cwd: Path, log: Path, env: dict[str, str] | None = None, timeout: float = 3600,
                linger_s: float = 60, interval: float = 1.0) -> dict[str, Any]:
    """Run ``argv`` and count the CPU of every process it starts, however detached: this
    process must be a child subreaper (``become_subreaper``). After ``argv`` exits, every
    remaining descendant is reaped (``reap``). Returns the ``RUSAGE_CHILDREN`` delta
    (``cpu_s``, ``user_s``, ``sys_s``), wall time, load averages before and after, the
    processes killed for lingering, the sampler's figures and the exit status (``rc``)."""
    skip = set(descendants(proc_table(), os.getpid(), set()))  # processes from before: not this run's
    load_before = os.getloadavg()
    c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    sampler = Sampler(skip, interval)
    sampler.start()
    started = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            rc = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            rc = proc.wait()
    wall = time.perf_counter() - started
    killed = reap(skip, linger_s, sampler.sample)
    after_reap = time.perf_counter() - started
    sampler.stopped.set()
    sampler.join()
    c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    load_after = os.getloadavg()
    user, sys_ = c1.ru_utime - c0.ru_utime, c1.ru_stime - c0.ru_stime
    return {"rc": rc, "cpu_s": user + sys_, "user_s": user, "sys_s": sys_, "wall_s": wall,
            "wall_incl_reaping_s": after_reap,
            "load_before": [round(x, 2) for x in load_before], "load_after": [round(x, 2) for x in load_after],
            "killed_lingering": killed, "sampled": sampler.figures()}


def run_study(proj: Path, timeout: float = 3600, linger_s: float = 60) -> dict[str, Any]:
    """``snakemake --profile profiles/local`` in ``proj``, every process's CPU counted
    (``run_counted``), with its candidates and Snakemake's per-job benchmarks by rule."""
    from pairflow.plan.candidates import candidates

    study = load(proj)
    n = sum(len(candidates(study, p)) for p in study.panels)
    snakemake = Path(sys.executable).with_name("snakemake")
    r = run_counted([str(snakemake), "--profile", "profiles/local"], proj, proj / "snakemake.log", study_env(proj),
                    timeout, linger_s)
    if r["rc"]:
        raise RuntimeError(f"snakemake failed ({r['rc']}) in {proj}:\n" + (proj / "snakemake.log").read_text()[-4000:])
    jobs = job_benchmarks(study.scratch)
    return {"candidates": n, **r, "jobs": jobs, "jobs_cpu_s": sum(j["cpu_s"] for j in jobs.values())}


# ---------------------------------------------------------------------------------------


def split(c1: float, n1: int, ck: float, nk: int) -> tuple[float, float]:
    """(marginal, fixed) CPU seconds from two runs of ``n1`` and ``nk`` candidates."""
    marginal = (ck - c1) / (nk - n1)
    return marginal, c1 - n1 * marginal


def line(marginal: float, fixed: float, floor: float) -> str:
    return f"cost: marginal/floor {marginal / floor:.2f} fixed {fixed:.1f} CPU-s"


def history_row(out: dict[str, Any], note: str = "") -> dict[str, Any]:
    """One run's summary for the section's table of runs."""
    r1, rk = out["runs"]["1x"], out["runs"][f"{out['multiples'][1]}x"]
    return {"date": out["date"], "commit": (out["commit"].get("commit") or "")[:12], "dirty": out["commit"].get("dirty"),
            "load": [r1["load_before"][0], r1["load_after"][0], rk["load_before"][0], rk["load_after"][0]],
            "floor_cpu_s": out["floor_cpu_s"], "marginal_cpu_s": out["marginal_cpu_s"],
            "marginal_over_floor": out["marginal_over_floor"], "fixed_cpu_s": out["fixed_cpu_s"],
            "candidates": [r1["candidates"], rk["candidates"]], "note": note}


def bench_cost(runs: int, quick: bool = False, multiple: int | None = None, floor_only: bool = False,
               history: list[dict[str, Any]] | None = None, note: str = "") -> dict[str, Any]:
    """The floor and the study at 1x and ``multiple`` x (default 4, quick 2). ``quick``:
    the base study is the first prompt of each panel (its seeds, arms and settings
    unchanged) and the floor is measured on one pair. ``runs`` is not used: each
    figure is one run (two whole studies are the expensive part). ``history``: the
    earlier runs' summaries (``history_row``); a full run adds its own."""
    from pairflow.envinfo import code_version
    from pairflow.plan.candidates import candidates

    multiple = multiple or (2 if quick else 4)
    cfg = base_config()
    base = {k: 1 for k in cfg["panels"]} if quick else base_prompts(cfg)
    become = become_subreaper()
    top = Path(tempfile.mkdtemp(prefix="pairflow-cost-", dir="/tmp"))
    out: dict[str, Any] = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                           "commit": code_version(str(ROOT)), "cpus": os.cpu_count(), "base_prompts": base,
                           "multiples": [1, multiple], "subreaper": become}
    try:
        model, tree = model_source(top), snapshot(top / "tree")
        proj1 = study_project(top / "x1", 1, base, model, tree)
        study = load(proj1)
        cands = [c for p in study.panels for c in candidates(study, p)]
        arms = len(study.arms)
        warm, measured = cands[:arms], (cands[arms:2 * arms] if quick else cands)
        out["load_before_floor"] = [round(x, 2) for x in os.getloadavg()]
        out["floor"] = measure_floor(study, measured, warm, top / "floor")
        if floor_only:
            shutil.rmtree(top, ignore_errors=True)
            return out
        shutil.rmtree(study.scratch, ignore_errors=True)  # fresh storage (the floor writes none)
        shutil.rmtree(study.work, ignore_errors=True)
        study_runs = {}
        for k, proj in ((1, proj1), (multiple, None)):
            proj = proj or study_project(top / f"x{k}", k, base, model, tree)
            study_runs[f"{k}x"] = run_study(proj)
            shutil.rmtree(proj / "results", ignore_errors=True)
        out["runs"] = study_runs
        r1, rk = study_runs["1x"], study_runs[f"{multiple}x"]
        m, f = split(r1["cpu_s"], r1["candidates"], rk["cpu_s"], rk["candidates"])
        floor = out["floor"]["per_candidate_cpu_s"]
        out.update({"marginal_cpu_s": m, "fixed_cpu_s": f, "floor_cpu_s": floor, "marginal_over_floor": m / floor,
                    "line": line(m, f, floor)})
        # where the marginal goes: per rule (Snakemake's benchmark files; the sampler's) and per kind of process
        dn = rk["candidates"] - r1["candidates"]
        out["marginal_by_rule_cpu_s"] = {
            rule: (rk["jobs"].get(rule, {}).get("cpu_s", 0.0) - r1["jobs"].get(rule, {}).get("cpu_s", 0.0)) / dn
            for rule in sorted(set(r1["jobs"]) | set(rk["jobs"]))}
        out["marginal_outside_jobs_cpu_s"] = ((rk["cpu_s"] - rk["jobs_cpu_s"]) - (r1["cpu_s"] - r1["jobs_cpu_s"])) / dn
        for by in ("kind", "rule"):
            a, b = r1["sampled"][f"cpu_s_by_{by}"], rk["sampled"][f"cpu_s_by_{by}"]
            out[f"marginal_sampled_by_{by}_cpu_s"] = {x: (b.get(x, 0.0) - a.get(x, 0.0)) / dn for x in sorted(set(a) | set(b))}
        out["marginal_unsampled_cpu_s"] = ((rk["cpu_s"] - rk["sampled"]["cpu_s"]) - (r1["cpu_s"] - r1["sampled"]["cpu_s"])) / dn
        out["history"] = [*(history or []), *([] if quick else [history_row(out, note)])]
        shutil.rmtree(top, ignore_errors=True)
    except BaseException:
        print(f"cost: kept {top} for the post-mortem", file=sys.stderr)
        raise
    return out
