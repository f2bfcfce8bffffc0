"""The prepared GPU check (run by ``benchmarks/gpu_check.sh``): the default study on CUDA
in bfloat16 with the tiny model, its timed pass, and NVML telemetry, written to one JSON.

Runs in a fresh copy of the project under a temporary directory, so the checkout's
results are untouched. Figures: wall time, work share (per-video work over the jobs'
wall time, from records and Snakemake's benchmark files), slot busy share, NVML samples
per panel job (``nvml_samples_ok``: at least ``MIN_NVML_SAMPLES`` in each), and per arm
the timed pass's median latency, denoise/decode split, repeat CV, peak device memory,
estimated MFU and the throttle reasons NVML reported while the timed runs ran (polled
during each run; ``gpu_idle`` excluded; "not watched" where no poll was answered).

Checks first that torch sees CUDA (the driver it needs explains a failure) and that
Snakemake is installed beside the interpreter (exit 2, before anything is measured).
``complete`` is true only when the study finished and ran on CUDA: every generation
record's worker on ``cuda`` and every timed record clocked by CUDA events (a worker that
finds no CUDA falls back to the CPU; ``incomplete`` says why not). The JSON is written
at every step; Snakemake's log is written beside it (``<out>.snakemake.log``), the
rules' logs are copied to ``<out stem>_logs/`` and their tails kept in the JSON. On
SIGTERM (``gpu_check.sh``'s outer timeout) the study's process group is killed, the JSON
gets ``stopped`` and what was measured, and the exit code is 124. ``--deadline`` (epoch
seconds) bounds the study: its timeout is the time left before it less ``RESERVE_S``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "workflow"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from pairflow.atomic import TMP_PREFIX  # noqa: E402  (after the path set-up above; imports without torch)
from pairflow.fleet.telemetry import OBSERVERS_VAR  # noqa: E402

RESERVE_S = 30
"""Seconds kept after the study for collecting its figures, writing the JSON and removing the copy."""
MIN_NVML_SAMPLES = 10
"""NVML samples each panel job must have (the issue's requirement, at ``--nvml-interval`` 1 s)."""
TAIL_CHARS = 6000
"""Characters of Snakemake's log kept in the JSON; each rule log keeps ``TAIL_CHARS // 2``."""
KEEP_BYTES = 2**20
"""The most of one log file copied beside the JSON (its end)."""


class Stopped(Exception):
    """SIGTERM arrived (``gpu_check.sh``'s outer timeout): stop, kill the study, report."""


def _on_sigterm(signum: int, frame: Any) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # timeout(1) signals the child, then its group: once is enough
    raise Stopped


def gpu_info() -> dict[str, Any]:
    """The GPU this check runs on (device 0), as torch and NVML report it."""
    import torch

    from pairflow.envinfo import environment
    from pairflow.fleet.telemetry import gpu_state

    props = torch.cuda.get_device_properties(0)
    env = environment()
    return {"name": props.name, "memory_gib": props.total_memory / 2**30, "capability": f"{props.major}.{props.minor}",
            "uuid": str(props.uuid), "torch": torch.__version__, "cuda": torch.version.cuda,
            "driver": env["driver"], "bf16_supported": torch.cuda.is_bf16_supported(),
            "state_before": gpu_state(str(props.uuid), os.getpid())}


def read_json(scratch: Path, pattern: str, errors: dict[str, str]) -> Iterator[tuple[Path, dict[str, Any]]]:
    """Each JSON file under ``scratch`` matching ``pattern``, parsed; atomic writers' temp
    files (``pairflow.atomic.TMP_PREFIX``) skipped; a file that cannot be read or parsed
    is named in ``errors`` and skipped (one bad file never stops the report)."""
    for p in sorted(scratch.glob(pattern)):
        if p.name.startswith(TMP_PREFIX):
            continue
        try:
            r = json.loads(p.read_text())
        except (OSError, ValueError) as e:
            errors[str(p.relative_to(scratch))] = f"{type(e).__name__}: {e}"
            continue
        if isinstance(r, dict):
            yield p, r
        else:
            errors[str(p.relative_to(scratch))] = f"not a JSON object: {type(r).__name__}"


def timing_summary(scratch: Path, errors: dict[str, str] | None = None) -> dict[str, Any]:
    """Per arm, over the timed pass's sampled records: medians of latency, phases and
    repeat CV, the largest peak device memory, and every throttle reason NVML reported
    while a timed run ran (``gpu_idle`` excluded), with how many runs were watched (a run
    whose watch no poll answered is not watched: its 'no reason' is no evidence)."""
    errors = {} if errors is None else errors
    by: dict[str, list[dict[str, Any]]] = {}
    for p, r in read_json(scratch, "panels/*/timing/*/*.json", errors):
        if r.get("sampled", True):
            try:
                by.setdefault(r["arm"]["name"], []).append(r)
            except (KeyError, TypeError) as e:
                errors[str(p.relative_to(scratch))] = f"{type(e).__name__}: {e}"
    out = {}
    for arm, rs in by.items():
        try:
            out[arm] = _arm_timing(rs)
        except (KeyError, TypeError, ValueError, statistics.StatisticsError) as e:
            errors[f"timing:{arm}"] = f"{type(e).__name__}: {e}"
    return out


def _arm_timing(rs: list[dict[str, Any]]) -> dict[str, Any]:
    ts = [r["timing"] for r in rs]
    runs = [run for r in rs for run in (r.get("gpu") or [])]
    cvs = [t["cv"] for t in ts if t.get("cv") is not None]
    watched = [run for run in runs if (run.get("throttled") or {}).get("status") == "watched"
               and (run.get("throttled") or {}).get("polls", 1)]
    # reasons NVML reported while a timed run ran (polled during it), gpu_idle excluded
    reasons = sorted({x for run in watched for x in (run["throttled"].get("reasons") or [])})
    others = max((len(run.get(side, {}).get("other_processes") or []) for run in runs
                  for side in ("gpu_before", "gpu_after")), default=0)
    temps = [run[side]["temperature_c"] for run in runs for side in ("gpu_before", "gpu_after")
             if "temperature_c" in run.get(side, {})]
    return {"candidates": len(rs), "latency_s": statistics.median(t["latency_s"] for t in ts),
            "denoise_s": statistics.median(t["phases_s"]["denoise"] for t in ts),
            "decode_s": statistics.median(t["phases_s"]["decode"] for t in ts),
            "cv": statistics.median(cvs) if cvs else None,
            "over_max_cv": sum(bool(t.get("over_max_cv")) for t in ts),
            "clock": sorted({str(t.get("clock")) for t in ts}), "cuda_settings": ts[0].get("cuda_settings"),
            "peak_device_mb": max((t.get("peak_device_mb") or 0.0) for t in ts),
            "throttle_reasons": reasons, "throttle_runs_watched": len(watched), "timed_runs": len(runs),
            "max_other_processes": others,
            "temperature_c": [min(temps), max(temps)] if temps else None,
            "matches_bulk_frames": sum(bool(r.get("matches_bulk_frames")) for r in rs)}


def cuda_check(scratch: Path, errors: dict[str, str] | None = None) -> dict[str, Any]:
    """Whether the study really ran on CUDA (a worker without CUDA falls back to the CPU,
    ``arms.base.device``): every generation record's ``worker.device`` is ``cuda`` and
    every sampled timing record's clock is ``cuda_events``; ``ok`` False with ``why``
    otherwise (also when there are no such records)."""
    errors = {} if errors is None else errors
    gen = [(p, r) for p, r in read_json(scratch, "panels/*/records/*/*.json", errors)]
    timed = [(p, r) for p, r in read_json(scratch, "panels/*/timing/*/*.json", errors) if r.get("sampled", True)]
    not_cuda = [f"{p.relative_to(scratch)}: device {(r.get('worker') or {}).get('device')!r}" for p, r in gen
                if (r.get("worker") or {}).get("device") != "cuda"]
    not_events = [f"{p.relative_to(scratch)}: clock {(r.get('timing') or {}).get('clock')!r}" for p, r in timed
                  if (r.get("timing") or {}).get("clock") != "cuda_events"]
    why = [*(["no generation records"] if not gen else []), *(["no sampled timing records"] if not timed else []),
           *([f"{len(not_cuda)} of {len(gen)} generation records not generated on cuda (first: {not_cuda[0]})"]
             if not_cuda else []),
           *([f"{len(not_events)} of {len(timed)} timing records not clocked by CUDA events (first: "
              f"{not_events[0]})"] if not_events else [])]
    return {"ok": not why, "why": "; ".join(why) or None, "generation_records": len(gen),
            "timing_records": len(timed)}


def nvml_by_panel(scratch: Path, errors: dict[str, str] | None = None) -> dict[str, Any]:
    """Each panel job's NVML section (``panels/<panel>/telemetry/<job>.json``), keyed
    ``<panel>/<job>`` (two panels' jobs share a file name; ``study/fleet`` for the one job
    of ``fleet.allocation: study``), with the fewest samples any of its GPUs got (0 when
    none was sampled)."""
    errors = {} if errors is None else errors
    out = {}
    for pattern in ("panels/*/telemetry/*.json", "study/telemetry/fleet.json"):
        for p, r in read_json(scratch, pattern, errors):
            nv = r.get("nvml") or {}
            counts = [int(g.get("samples") or 0) for g in (nv.get("summary") or {}).values()]
            out[f"{p.parent.parent.name}/{p.stem}"] = {**nv, "min_samples": min(counts, default=0)}
    return out


def driver_check() -> dict[str, Any]:
    """Whether torch sees CUDA, with the driver NVML reports and the driver the installed
    torch wheel needs to explain a failure; ``ok`` False with ``why`` saying what to fix
    (printed before anything is measured, so a wrong driver costs seconds, not the
    8-minute budget). torch is asked first: a driver older than the wheel's CUDA may
    still run it (forward-compatibility packages), so the version alone never refuses."""
    import torch

    from pairflow.envinfo import environment

    cuda = torch.version.cuda
    need = DRIVER_FOR_CUDA.get(int(cuda.split(".")[0])) if cuda else None
    driver = environment().get("driver")
    out: dict[str, Any] = {"torch": torch.__version__, "torch_cuda": cuda, "driver": driver,
                           "driver_needed": f"R{need}+" if need else None, "cuda_available": False}
    if cuda is None:
        return {**out, "ok": False, "why": f"torch {torch.__version__} is a CPU-only build; install the CUDA wheel"}
    out["cuda_available"] = torch.cuda.is_available()
    if out["cuda_available"]:
        return {**out, "ok": True}
    major = None
    try:
        major = int(str(driver).split(".")[0])
    except ValueError:
        pass
    if driver is None:
        return {**out, "ok": False, "why": f"no NVIDIA driver is loaded here (NVML and nvidia-smi find none); torch "
                                            f"{torch.__version__} (CUDA {cuda}) needs driver R{need}+"}
    if need and major is not None and major < need:
        return {**out, "ok": False, "why": f"torch sees no CUDA device, and driver {driver} is older than R{need}, "
                                            f"which torch {torch.__version__} (CUDA {cuda}) needs; upgrade the "
                                            "driver, install CUDA's forward-compatibility package, or install a "
                                            "wheel built for an older CUDA"}
    return {**out, "ok": False, "why": f"torch sees no CUDA device (driver {driver}, CUDA_VISIBLE_DEVICES="
                                        f"{os.environ.get('CUDA_VISIBLE_DEVICES')!r}); torch needs driver "
                                        f"R{need}+ for CUDA {cuda}"}


DRIVER_FOR_CUDA = {13: 580, 12: 525, 11: 450}
"""Oldest NVIDIA driver branch each CUDA major version's wheels run on (minor-version
compatibility within a major): a CUDA 13 torch wheel needs R580 or newer."""


def mfu_by_arm(scratch: Path, timing: dict[str, Any], device_name: str,
               errors: dict[str, str] | None = None) -> dict[str, Any]:
    """Per arm: estimated MFU (``compute.estimated_mfu``: counted forward FLOPs of the
    bulk record over the timed median latency over the device's dense BF16 peak; none
    where FLOPs were not counted, ``stats._call_flops``, or the device is a MIG slice)
    and the peak device memory, beside the timed speedup against control."""
    from pairflow.analysis.stats import _call_flops  # the report's own rule: uncounted (-1) FLOPs give no MFU
    from pairflow.generation.compute import MIG_SLICE, bf16_peak, estimated_mfu

    errors = {} if errors is None else errors
    flops: dict[str, list[float]] = {}
    for p, r in read_json(scratch, "panels/*/records/*/*.json", errors):
        try:
            f = _call_flops({**r, "compute": r.get("compute")})
            if f is not None:
                flops.setdefault(r["arm"]["name"], []).append(f)
        except (KeyError, TypeError, ValueError) as e:
            errors[str(p.relative_to(scratch))] = f"{type(e).__name__}: {e}"
    ctrl = (timing.get("control") or {}).get("latency_s")
    why = (MIG_SLICE if "MIG" in device_name.split() else
           f"{device_name} is not in compute.BF16_DENSE_PEAK_TFLOPS" if bf16_peak(device_name) is None else None)
    out = {}
    for arm, t in timing.items():
        try:
            f = statistics.median(flops[arm]) if flops.get(arm) else None
            out[arm] = {"flops": f, "latency_s": t["latency_s"], "peak_device_mb": t["peak_device_mb"],
                        "speedup": ctrl / t["latency_s"] if ctrl and t["latency_s"] else None,
                        "mfu": estimated_mfu(f, t["latency_s"], device_name) if f else None,
                        "mfu_absent": why if f else "no counted FLOPs in the bulk records"}
            if out[arm]["mfu"] is not None:
                out[arm]["mfu_absent"] = None
        except (KeyError, TypeError, ValueError, ZeroDivisionError) as e:
            errors[f"per_arm:{arm}"] = f"{type(e).__name__}: {e}"
    return out


def rule_logs(scratch: Path, keep: Path | None) -> dict[str, str]:
    """The tail of each non-empty rule log (``scratch/logs/**``: the rules' ``log:``
    files, where a job's traceback lands), keyed by its path under ``logs``; the logs and
    the Parsl run folders' ``*.log`` files (the last ``KEEP_BYTES`` of each) are copied
    under ``keep`` first (so they outlive the temporary project)."""
    logs = scratch / "logs"
    if keep is not None:
        shutil.rmtree(keep, ignore_errors=True)
        for src in [*logs.rglob("*"), *(scratch / "panels").glob("*/run/**/*.log"), *(scratch / "study").glob(
                "run/**/*.log")]:
            if src.is_file():
                dst = keep / src.relative_to(scratch)
                try:
                    dst.parent.mkdir(parents=True, exist_ok=True)
                    with src.open("rb") as fh:  # the last MiB of a long (Parsl debug) log is where it failed
                        fh.seek(max(0, src.stat().st_size - KEEP_BYTES))
                        dst.write_bytes(fh.read())
                except OSError:
                    continue
    out = {}
    for p in sorted(logs.rglob("*.log")):
        try:
            text = p.read_text(errors="replace")
        except OSError:
            continue
        if text.strip():
            out[str(p.relative_to(logs))] = text[-TAIL_CHARS // 2:]
    return out


def write(path: Path, result: dict[str, Any]) -> None:
    from pairflow.atomic import write_text

    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, json.dumps(result, indent=1, sort_keys=True, default=str) + "\n")


def snakemake_command() -> Path:
    """The Snakemake installed beside this interpreter (the project's environment)."""
    return Path(sys.executable).with_name("snakemake")


def _kill_group(proc: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGTERM the process group ``proc`` leads, SIGKILL it after ``grace_s``."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_study(project: Path, env: dict[str, str], timeout: float, log: Path,
              snakemake: Path | None = None) -> tuple[int | None, float]:
    """Run the study's Snakemake in its own session, output to ``log``; on overrun the
    whole session is killed and the return code is None. On any exception while it runs
    (``Stopped``: SIGTERM; Ctrl-C) the session is killed (short grace) before it propagates:
    the study never outlives the check."""
    tick = time.perf_counter()
    with log.open("w") as fh:
        proc = subprocess.Popen([str(snakemake or snakemake_command()), "--profile", "profiles/local"],
                                cwd=project, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        rc: int | None = None
        try:
            try:
                rc = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                _kill_group(proc, 15)
        except BaseException:  # also while the overrun's grace runs
            _kill_group(proc, 3)
            raise
    return rc, time.perf_counter() - tick


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="the JSON to write")
    ap.add_argument("--timeout", type=int, default=420, help="seconds the study may take at most")
    ap.add_argument("--deadline", type=float, default=None,
                    help="epoch seconds by which the JSON must be final (gpu_check.sh's budget): the study's timeout "
                         f"is the time left before it less {RESERVE_S} s, at most --timeout")
    ap.add_argument("--nvml-interval", type=float, default=1.0,
                    help=f"seconds between NVML samples in the study's jobs (>= {MIN_NVML_SAMPLES} samples per panel "
                         "job)")
    args = ap.parse_args(argv)
    # The study's jobs see CUDA_VISIBLE_DEVICES (default 0): this process reads the same GPU (set before torch loads).
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "0")
    deadline = args.deadline if args.deadline is not None else time.time() + args.timeout + RESERVE_S
    result: dict[str, Any] = {"kind": "gpu_check", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                              "complete": False}
    ctx: dict[str, Any] = {"log": args.out.with_name(args.out.stem + ".snakemake.log"),
                           "keep": args.out.with_name(args.out.stem + "_logs")}
    ctx["log"].unlink(missing_ok=True)  # an earlier run's, never this one's
    shutil.rmtree(ctx["keep"], ignore_errors=True)
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        try:
            code = _check(args, deadline, result, ctx)
        except Stopped:
            result.update({"stopped": "outer timeout: SIGTERM (gpu_check.sh's timeout) before the check finished",
                           "timed_out": True})
            code = 124
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # finishing takes seconds; the kill grace covers it
        _finish(result, ctx, args.out)
    finally:
        signal.signal(signal.SIGTERM, previous)
    if code == 0 and not result["complete"]:
        code = 1
    return code


def _check(args: argparse.Namespace, deadline: float, result: dict[str, Any], ctx: dict[str, Any]) -> int:
    """The driver check, then the study; what it learns goes into ``result`` (written at
    each step). Returns the exit code: 0 when the study finished, 1 when it failed or
    overran, 2 when nothing could be measured."""
    check = driver_check()
    result["driver_check"] = check
    write(args.out, result)  # whatever happens next, the driver check is on disk
    print(f"gpu_check: driver {check['driver']}, torch {check['torch']} (CUDA {check['torch_cuda']}, needs "
          f"{check['driver_needed']}), CUDA available: {check['cuda_available']}", flush=True)
    if not check["ok"]:
        print(f"gpu_check: {check['why']}; nothing measured", file=sys.stderr)
        return 2
    snakemake = snakemake_command()
    if not snakemake.is_file():
        result["error"] = (f"no snakemake beside {sys.executable} ({snakemake}): install the project's environment "
                           "into that interpreter's venv (workflow/setup.sh), or set PYTHON to one that has it")
        print(f"gpu_check: {result['error']}; nothing measured", file=sys.stderr)
        return 2
    import yaml

    info = gpu_info()
    result["gpu"] = info
    write(args.out, result)
    project = Path(tempfile.mkdtemp(prefix="pairflow-gpu-")) / "project"
    ctx["project"] = project
    project.mkdir()
    for name in ("Snakefile", "workflow", "envs", "profiles", "config"):
        src = ROOT / name
        (shutil.copytree(src, project / name, ignore=shutil.ignore_patterns("__pycache__")) if src.is_dir()
         else shutil.copy(src, project / name))
    cfg = yaml.safe_load((project / "config" / "config.yaml").read_text())
    dtype = "bfloat16" if info["bf16_supported"] else "float16"
    cfg["generation"]["dtype"] = dtype
    cfg.setdefault("fleet", {})["nvml_interval_s"] = args.nvml_interval
    (project / "config" / "config.yaml").write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "PATH": f"{snakemake.parent}{os.pathsep}{os.environ['PATH']}",
           "CUDA_VISIBLE_DEVICES": os.environ["CUDA_VISIBLE_DEVICES"],
           # this process read the GPU's properties (a CUDA context): not another user of the device
           OBSERVERS_VAR: str(os.getpid())}
    timeout = min(float(args.timeout), deadline - time.time() - RESERVE_S)
    result.update({"dtype": dtype, "nvml_interval_s": args.nvml_interval, "study_timeout_s": timeout,
                   "snakemake_log": str(ctx["log"])})
    if timeout < 30:
        result["error"] = f"only {timeout:.0f} s left for the study before the deadline; not started"
        return 1
    result["study_started"] = time.time()
    write(args.out, result)
    rc, wall = run_study(project, env, timeout, ctx["log"], snakemake)
    result.update({"study_wall_s": wall, "snakemake_rc": rc, "timed_out": rc is None})
    return 0 if rc == 0 else 1


def _finish(result: dict[str, Any], ctx: dict[str, Any], out: Path) -> None:
    """Everything the study left, each part on its own (a failed or stopped study still
    reports what it measured), ``complete`` decided, the JSON written, the copy removed."""
    project: Path | None = ctx.get("project")
    log: Path = ctx["log"]
    if "study_started" in result and "study_wall_s" not in result:  # stopped while it ran
        result["study_wall_s"] = time.time() - result["study_started"]
    if "study_started" in result and result.get("snakemake_rc") != 0 and log.is_file():
        result["snakemake_tail"] = log.read_text(errors="replace")[-TAIL_CHARS:]
    if project is None:
        write(out, result)
        return
    scratch = project / "results" / "scratch"
    errors: dict[str, str] = {}
    try:  # the real error first: the rules' logs, before anything slower
        result["rule_logs"] = rule_logs(scratch, ctx["keep"])
        result["rule_logs_copied_to"] = str(ctx["keep"])
    except OSError as e:
        errors["rule_logs"] = f"{type(e).__name__}: {e}"
    write(out, result)
    from run import bench_e2e  # the e2e benchmark section: work share from records and benchmark files

    parts: dict[str, Callable[[], Any]] = {
        "cuda_check": lambda: cuda_check(scratch, errors),
        "timing": lambda: timing_summary(scratch, errors),
        "e2e": lambda: bench_e2e(1, False, scratch),
        "utilisation": lambda: json.loads((scratch / "study" / "utilisation.json").read_text()),
        "nvml_summary": lambda: nvml_by_panel(scratch, errors),
        "timed_pass": lambda: json.loads((scratch / "study" / "telemetry" / "timed_pass.json").read_text()),
        "table": lambda: (scratch / "study" / "table.md").read_text(),
    }
    missing = {}
    for name, get in parts.items():
        try:
            result[name] = get()
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            missing[name] = f"{type(e).__name__}: {e}"
    if missing:
        result["not_measured"] = missing
    nv = result.get("nvml_summary") or {}
    samples = {k: v["min_samples"] for k, v in nv.items()}
    result["nvml_min_samples"] = samples
    result["nvml_samples_ok"] = bool(samples) and min(samples.values()) >= MIN_NVML_SAMPLES
    gpu = result.get("gpu") or {}
    if result.get("timing"):
        result["per_arm"] = mfu_by_arm(scratch, result["timing"], str(gpu.get("name", "")), errors)
    u = result.get("utilisation") or {}
    if isinstance(u, dict) and u:
        result["busy_share"] = u.get("busy_share")
        jobs = {}
        for j in u.get("jobs") or []:
            try:
                jobs[j["job"]] = {"window_s": j["window_s"], "tasks": j["tasks"], "nvml": j["nvml"],
                                  "slots": {k: v["share"] for k, v in j["slots"].items()}}
            except (KeyError, TypeError, AttributeError) as e:
                errors[f"utilisation job {j.get('job') if isinstance(j, dict) else j!r}"] = f"{type(e).__name__}: {e}"
        result["jobs"] = jobs
    if errors:
        result["unreadable"] = errors
    if gpu.get("uuid"):
        from pairflow.fleet.telemetry import gpu_state

        gpu["state_after"] = gpu_state(gpu["uuid"], os.getpid())
    incomplete = [*([result["stopped"]] if result.get("stopped") else []),
                  *(["the study overran its timeout"] if result.get("timed_out") and not result.get("stopped") else []),
                  *([f"the study failed (snakemake rc {result['snakemake_rc']})"]
                    if result.get("snakemake_rc") not in (0, None) else []),
                  *([f"not on CUDA: {(result.get('cuda_check') or {}).get('why') or 'not checked'}"]
                    if not (result.get("cuda_check") or {}).get("ok") else [])]
    result["complete"] = not incomplete
    result["incomplete"] = "; ".join(incomplete) or None
    write(out, result)
    shutil.rmtree(project.parent, ignore_errors=True)
    print(f"gpu_check: {gpu.get('name')}: study {result.get('study_wall_s', float('nan')):.1f} s "
          f"(rc {result.get('snakemake_rc')}); {'complete' if result['complete'] else result['incomplete']}; "
          f"wrote {out}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
