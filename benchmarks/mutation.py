"""Mutation testing of the statistics (issue 39 item 5): does every formula in
``workflow/pairflow/analysis`` have a test that fails when its direction, its constant or
its switch changes?

Tool: cosmic-ray (its operators make the mutants and apply them, one edit each); this
script picks which mutants to run, runs the analysis tests on each in a private copy of the
checkout (``--workers`` copies side by side, the checkout itself is never edited), and
writes every mutant with its outcome to ``benchmarks/mutation.json``.

Run it with a Python that has cosmic-ray (a separate venv; it never enters the project's):

    python3 -m venv /tmp/crvenv && /tmp/crvenv/bin/pip install cosmic-ray==8.7.0
    .venv/bin/python -m pip install --target /tmp/covlib coverage     # which tests reach which line
    /tmp/crvenv/bin/python benchmarks/mutation.py --workers 2          # the five modules
    /tmp/crvenv/bin/python benchmarks/mutation.py --rerun benchmarks/mutation.json  # its survivors and the mutants it never ran

The tests run under ``--python`` (the project venv's by default) with the copy's
``workflow`` first on PYTHONPATH and no bytecode written (a mutant must never be read from a
stale ``.pyc``).

Which mutants (``select``):

* operators, one edit each, of the three kinds the issue names: direction (``+``/``-``,
  ``*``/``/``, ``**`` to ``*``, a unary minus dropped, ``<`` to ``>`` and back), constant
  (every number literal to n + 1 and n - 1, cosmic-ray's NumberReplacer) and switch
  (``<``/``<=``, ``>``/``>=``, ``==``/``!=``, ``and``/``or``, ``True``/``False``, a
  condition negated);
* positions in formula code only: none inside an f-string or other string (message text),
  a ``raise`` statement (the error's wording) or a type annotation; in ``stats.py`` only
  the functions that compute or read a statistic (``FORMULA_FUNCTIONS``; the rest pairs
  records, checks provenance and assembles efficiency tables, tested elsewhere).

A mutant is *killed* when the tests fail (or run past ``--timeout``), *survived* when they
pass. The tests: those of the analysis tests that reach the mutated statement (coverage.py
over one unmutated run, one context per test: ``mutation_plugin``), the mutated module's own
file first, so ``-x`` stops at the first failure; every analysis test for a statement run at
import; none (survived unrun) where no test reaches it. Without ``--coverage-lib``, every
analysis test for every mutant.
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import json
import os
import queue
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ANALYSIS = Path("workflow/pairflow/analysis")
MODULES = ("inference", "stats", "verdicts", "exact", "tail")
"""Run by default; ``planning`` and ``sequential`` on request (``--modules``)."""
TESTS = ("test_inference", "test_stats", "test_verdicts", "test_exact", "test_tail", "test_planning",
         "test_sequential")
OWN_TESTS = {"inference": "test_inference", "stats": "test_stats", "verdicts": "test_verdicts",
             "exact": "test_exact", "tail": "test_tail", "planning": "test_planning", "sequential": "test_sequential"}
OPERATORS = (
    # direction
    "core/ReplaceBinaryOperator_Add_Sub", "core/ReplaceBinaryOperator_Sub_Add",
    "core/ReplaceBinaryOperator_Mul_Div", "core/ReplaceBinaryOperator_Div_Mul",
    "core/ReplaceBinaryOperator_Pow_Mul", "core/ReplaceUnaryOperator_USub_UAdd",
    "core/ReplaceComparisonOperator_Lt_Gt", "core/ReplaceComparisonOperator_Gt_Lt",
    "core/ReplaceComparisonOperator_LtE_GtE", "core/ReplaceComparisonOperator_GtE_LtE",
    # constant
    "core/NumberReplacer",
    # switch
    "core/ReplaceComparisonOperator_Lt_LtE", "core/ReplaceComparisonOperator_LtE_Lt",
    "core/ReplaceComparisonOperator_Gt_GtE", "core/ReplaceComparisonOperator_GtE_Gt",
    "core/ReplaceComparisonOperator_Eq_NotEq", "core/ReplaceComparisonOperator_NotEq_Eq",
    "core/ReplaceAndWithOr", "core/ReplaceOrWithAnd", "core/ReplaceTrueWithFalse", "core/ReplaceFalseWithTrue",
    "core/AddNot",
)
FORMULA_FUNCTIONS = {
    "stats": {"_per_prompt", "t_procedure", "_interval", "_ratio_interval", "_latency_summary", "_sequential_design",
              "_compute", "_metric", "_tail", "diagnostics", "decide", "_test_name", "_p_verdict", "_planning",
              "_small_n_notes", "noise_flags", "holm"},
}
"""Per module, the functions whose mutants count (absent: every function and module level)."""


Span = tuple[tuple[int, int], tuple[int, int]]


def _spans(source: str) -> tuple[list[Span], list[Span], list[tuple[int, int, str]]]:
    """(spans that are not formula code: strings, f-strings, raise statements, annotations;
    spans of subscripts and ``axis=`` values; functions as (first line, last line, name)),
    positions as (line, column in characters)."""
    tree = ast.parse(source)
    lines = source.splitlines()

    def char_col(line: int, col: int) -> int:  # ast counts UTF-8 bytes, parso characters
        return len(lines[line - 1].encode()[:col].decode(errors="ignore"))

    skip: list[Span] = []
    index: list[Span] = []
    funcs: list[tuple[int, int, str]] = []
    for node in ast.walk(tree):
        spans: list[ast.AST] = []
        if isinstance(node, (ast.JoinedStr, ast.Raise)) or (isinstance(node, ast.Constant)
                                                              and isinstance(node.value, str)):
            spans.append(node)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            funcs.append((node.lineno, node.end_lineno or node.lineno, node.name))
            spans += [a.annotation for a in (*node.args.args, *node.args.kwonlyargs) if a.annotation is not None]
            spans += [node.returns] if node.returns is not None else []
        if isinstance(node, ast.AnnAssign):
            spans.append(node.annotation)
        for s in spans:
            skip.append(((s.lineno, char_col(s.lineno, s.col_offset)),
                         (s.end_lineno or s.lineno, char_col(s.end_lineno or s.lineno, s.end_col_offset or 0))))
        where: list[ast.AST] = []
        if isinstance(node, ast.Subscript):
            where.append(node.slice)
        if isinstance(node, ast.keyword) and node.arg == "axis":
            where.append(node.value)
        for s in where:
            index.append(((s.lineno, char_col(s.lineno, s.col_offset)),
                          (s.end_lineno or s.lineno, char_col(s.end_lineno or s.lineno, s.end_col_offset or 0))))
    return skip, index, funcs


def select(module: str) -> tuple[list[dict[str, Any]], Counter[str]]:
    """Every mutant of ``module`` this run tests, and how many were left out and why."""
    from cosmic_ray.ast import ast_nodes, get_ast_from_path
    from cosmic_ray.plugins import get_operator

    path = ROOT / ANALYSIS / f"{module}.py"
    source = path.read_text(encoding="utf-8")
    skip, index, funcs = _spans(source)
    keep_funcs = FORMULA_FUNCTIONS.get(module)
    tree = get_ast_from_path(path)
    lines = source.splitlines()
    out, left = [], Counter[str]()
    for name in OPERATORS:
        op = get_operator(name)()
        occurrence = 0
        seen: set[tuple[int, int]] = set()
        for node in ast_nodes(tree):
            for start, _end in op.mutation_positions(node):
                pos = (start[0], start[1])
                again = pos in seen
                seen.add(pos)
                enclosing = [f for f in funcs if f[0] <= pos[0] <= f[1]]
                func = min(enclosing, key=lambda f: f[1] - f[0])[2] if enclosing else "<module>"
                why = None
                if any(a <= pos < b for a, b in skip):
                    why = "message, string or annotation"
                elif name == "core/NumberReplacer" and again:
                    why = "a number's second offset (n - 1; n + 1 is run)"
                elif name == "core/NumberReplacer" and any(a <= pos < b for a, b in index):
                    why = "an index or axis number, not a constant of a formula"
                elif keep_funcs is not None and not any(f[2] in keep_funcs for f in enclosing):
                    why = "not a formula (record plumbing)"
                if why:
                    left[why] += 1
                else:
                    out.append({"module": module, "file": str(ANALYSIS / f"{module}.py"), "line": pos[0],
                                "col": pos[1], "function": func, "operator": name.split("/")[1],
                                "operator_path": name, "occurrence": occurrence,
                                "code": lines[pos[0] - 1].strip()})
                occurrence += 1
    return out, left


def _copy(dest: Path) -> None:
    """A private copy of the checkout's tracked and untracked files (not .git, not venvs)."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split("\n")
    for f in filter(None, files):
        src = ROOT / f
        if src.is_file():
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / f)


def _pytest_args(module: str, tests: list[str] | None = None) -> list[str]:
    """The test command: every analysis test file, ``module``'s own first; with ``tests``
    (node ids, in collection order), those tests only, ``module``'s own file's first."""
    own = OWN_TESTS[module]
    if tests is None:
        chosen = [f"tests/{t}.py" for t in [own] + [t for t in TESTS if t != own]]
    else:
        chosen = sorted(tests, key=lambda t: not t.startswith(f"tests/{own}.py::"))  # stable: keeps the order
    return ["-x", "-q", "-n", "0", "-p", "no:cacheprovider", "--no-header", "-o", "addopts=", "-p", "mutation_plugin",
            *chosen]


def _statement_lines(source: str) -> dict[int, tuple[int, int]]:
    """Per line, the lines of the innermost statement holding it (a compound statement's
    header only: an ``if``'s test, a ``def``'s signature), where coverage.py records it."""
    tree = ast.parse(source)
    out: dict[int, tuple[int, int]] = {}
    stmts = sorted((n for n in ast.walk(tree) if isinstance(n, ast.stmt)),
                   key=lambda n: (n.end_lineno or n.lineno) - n.lineno, reverse=True)
    for n in stmts:  # widest first, so the innermost statement has the last word
        end = n.end_lineno or n.lineno
        body = [b for f in ("body", "orelse", "handlers", "finalbody") for b in getattr(n, f, []) or []]
        if body:
            end = min(end, min(b.lineno for b in body) - 1)
            end = max(end, n.lineno)
        for line in range(n.lineno, end + 1):
            out[line] = (n.lineno, end)
    return out


def reaching(m: dict[str, Any], contexts: dict[str, dict[str, list[str]]], order: list[str]) -> list[str] | None:
    """The tests (node ids, in collection order) that run mutant ``m``'s statement; None
    where a line of it runs at import (a constant, a default, a class attribute: every
    test sees it, so all run)."""
    lines_of = _statement_lines((ROOT / m["file"]).read_text(encoding="utf-8"))
    first, last = lines_of.get(m["line"], (m["line"], m["line"]))
    by_line = next((v for k, v in contexts.items() if k.endswith(m["file"])), {})
    seen: set[str] = set()
    for line in range(first, last + 1):
        seen.update(by_line.get(str(line), []))
    if "" in seen or m["function"] == "<module>":
        return None
    rank = {t: i for i, t in enumerate(order)}
    return sorted(seen, key=lambda t: rank.get(t, len(rank)))


def _env(copy: Path, coverage_lib: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(copy / "workflow"), coverage_lib])),
               PYTHONDONTWRITEBYTECODE="1")
    env.pop("PYTEST_ADDOPTS", None)
    return env


PRELOAD = ("numpy", "scipy.stats", "scipy.optimize", "scipy.special", "yaml", "pytest", "xdist",
           "pairflow.errors", "pairflow.metrics", "pairflow.records.types", "pairflow.records.store",
           "pairflow.plan.config", "pairflow.generation.compute", "pairflow.arms", "pairflow.fleet.orphans",
           "pairflow.layout")
"""Imported once by the fork server: a mutant's test run forks from it and imports only
``pairflow.analysis`` afresh (checked: nothing preloaded imports it)."""


def serve() -> None:
    """The fork server (run under the project's Python, in a copy): per line of stdin
    ``{"args": [...], "timeout": s, "log": path}``, fork, run pytest in the child with its
    output to ``log`` and an alarm at ``timeout``, answer ``{"rc": exit code}``."""
    import importlib
    import signal

    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    import pairflow

    if not str(pairflow.__file__).startswith(os.getcwd()):
        sys.exit(f"pairflow imports from {pairflow.__file__}, not from this copy {os.getcwd()}")
    loaded = sorted(m for m in sys.modules if m.startswith("pairflow.analysis"))
    if loaded:
        sys.exit(f"preloading imported {loaded}: a mutant would be tested against the unmutated module")
    sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))  # -p mutation_plugin
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        job = json.loads(line)
        pid = os.fork()
        if pid == 0:
            os.environ.update(job.get("env", {}))
            fd = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            signal.alarm(int(job["timeout"]))
            import pytest

            os._exit(int(pytest.main(job["args"])))
        _pid, status = os.waitpid(pid, 0)
        print(json.dumps({"rc": os.waitstatus_to_exitcode(status)}), flush=True)


class Worker:
    """A private copy of the checkout and its fork server."""

    def __init__(self, copy: Path, python: str, coverage_lib: str) -> None:
        self.copy = copy
        _copy(copy)
        self.proc = subprocess.Popen([python, str(copy / "benchmarks" / "mutation.py"), "--serve"], cwd=copy,
                                     env=_env(copy, coverage_lib), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        ready = self.proc.stdout.readline()
        if not ready.startswith('{"ready"'):
            sys.exit(f"the fork server in {copy} did not start: {ready!r}")

    def pytest(self, args: list[str], timeout: float, env: dict[str, str] | None = None) -> tuple[int, str]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        log = self.copy / "pytest.log"
        self.proc.stdin.write(json.dumps({"args": args, "timeout": timeout, "log": str(log), "env": env or {}}) + "\n")
        self.proc.stdin.flush()
        rc = int(json.loads(self.proc.stdout.readline())["rc"])
        return rc, log.read_text(errors="replace")

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=30)


def run_one(m: dict[str, Any], w: Worker, timeout: float, tests: list[str] | None) -> dict[str, Any]:
    """Apply mutant ``m`` in ``w``'s copy, run the tests (``tests``: only these node ids;
    an empty list: no test reaches it, so it survives unrun), put the module back."""
    from cosmic_ray.mutating import mutate_code
    from cosmic_ray.plugins import get_operator

    target = w.copy / m["file"]
    original = target.read_text(encoding="utf-8")
    mutated = mutate_code(original, get_operator(m["operator_path"])(), m["occurrence"])
    if mutated is None:
        return {**m, "outcome": "no mutation", "seconds": 0.0}
    new_line = mutated.splitlines()[m["line"] - 1].strip()
    ran = "all" if tests is None else len(tests)
    if tests == []:
        return {**m, "mutated": new_line, "outcome": "survived", "failed": "", "tests": 0, "seconds": 0.0}
    t0 = time.monotonic()
    try:
        target.write_text(mutated, encoding="utf-8")
        rc, log = w.pytest(_pytest_args(m["module"], tests), timeout)
    finally:
        target.write_text(original, encoding="utf-8")
    outcome = ("survived" if rc == 0 else "killed" if rc == 1 else "killed (timeout)" if rc == -14
               else f"killed (pytest exit {rc})")
    failed = next((ln for ln in log.splitlines() if ln.startswith(("FAILED", "ERROR"))), "")
    return {**m, "mutated": new_line, "outcome": outcome, "failed": failed[:300], "tests": ran,
            "seconds": round(time.monotonic() - t0, 1)}


JUSTIFIED = ROOT / "benchmarks" / "mutation_justified.json"
"""Every survivor's justification, keyed by module, source line and mutated line (so a
justification outlives line numbers): ``[{"module", "code", "mutated", "why"}, ...]``."""


def _key(r: dict[str, Any]) -> tuple[str, str, str]:
    return r["module"], r["code"], r.get("mutated", "")


def markdown(out: dict[str, Any]) -> str:
    """The score per module and one row per survivor, with its justification from
    ``JUSTIFIED`` (or **open**)."""
    why = {_key(j): j["why"] for j in json.loads(JUSTIFIED.read_text())} if JUSTIFIED.exists() else {}
    rows = ["| module | killed | run | score |", "|---|---:|---:|---:|"]
    for module, sc in out["score"].items():
        rows.append(f"| {module}.py | {sc['killed']} | {sc['total']} | {100 * sc['killed'] / max(1, sc['total']):.1f}% |")
    t = out["total"]
    rows.append(f"| all | {t['killed']} | {t['total']} | {100 * t['killed'] / max(1, t['total']):.1f}% |")
    rows += ["", "| where | mutant | why it survives |", "|---|---|---|"]
    for r in out["mutants"]:
        if r["outcome"] == "survived":
            rows.append(f"| {r['module']}.py:{r['line']} `{r['function']}` | `{r['code']}` -> `{r['mutated']}` | "
                        f"{why.get(_key(r), '**open**')} |")
    return "\n".join(rows)


def combine(paths: list[Path]) -> dict[str, Any]:
    """One result from runs over disjoint modules (each module's latest run wins)."""
    runs = [json.loads(p.read_text()) for p in paths]
    by_module: dict[str, dict[str, Any]] = {}
    for run in runs:
        for module in run["score"]:
            by_module[module] = run
    mutants = [m for module, run in by_module.items() for m in run["mutants"] if m["module"] == module]
    score = {module: run["score"][module] for module, run in sorted(by_module.items())}
    total = {"killed": sum(s["killed"] for s in score.values()), "total": sum(s["total"] for s in score.values())}
    return {**runs[-1], "runs": [str(p) for p in paths], "seconds": sum(r["seconds"] for r in runs),
            "not_run": sum(r.get("not_run", 0) for r in runs), "score": score, "total": total,
            "mutants": sorted(mutants, key=lambda r: (r["module"], r["line"], r["col"], r["operator"]))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modules", nargs="+", default=None, help=f"default: {', '.join(MODULES)}; with --rerun, "
                    "every module the previous run holds")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--python", default=str(Path("/work/main/.venv/bin/python")))
    ap.add_argument("--coverage-lib", default="/tmp/covlib", help="a folder holding coverage.py for --python "
                    "(pip install --target it coverage); empty: every mutant runs every analysis test")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per mutant's test run (then killed)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "mutation.json")
    ap.add_argument("--rerun", type=Path, help="a previous JSON: run only its survivors and the mutants it never "
                    "ran (by module, operator, source line and column, so edits elsewhere do not lose them), and "
                    "merge the outcomes into it")
    ap.add_argument("--budget", type=float, default=18.0, help="minutes: mutants not started by then are "
                    "recorded as not run (they run in a seeded shuffled order, so those run are a random sample)")
    ap.add_argument("--list", action="store_true", help="count the mutants and exit")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--markdown", type=Path, help="print the score and survivor tables of this JSON and exit")
    ap.add_argument("--combine", type=Path, nargs="+", help="runs over disjoint modules: write them as one to --out "
                    "and exit")
    args = ap.parse_args()
    if args.serve:
        serve()
        return
    if args.markdown:
        print(markdown(json.loads(args.markdown.read_text())))
        return
    if args.combine:
        args.out.write_text(json.dumps(combine(args.combine), indent=1) + "\n")
        return
    try:
        import cosmic_ray  # noqa: F401
    except ImportError:
        sys.exit("cosmic-ray is not importable: run this script with a Python that has it, e.g. "
                 "python3 -m venv /tmp/crvenv && /tmp/crvenv/bin/pip install cosmic-ray==8.7.0")
    from importlib.metadata import version

    previous: list[dict[str, Any]] = json.loads(args.rerun.read_text())["mutants"] if args.rerun else []
    if args.modules is None:
        args.modules = sorted({p["module"] for p in previous}) if previous else list(MODULES)
    mutants, left = [], Counter[str]()
    for module in args.modules:
        ms, lo = select(module)
        mutants += ms
        left += lo
    current = {(m["module"], m["operator"], m["code"], m["col"]) for m in mutants}  # the code as it is now
    if args.rerun:
        key = {(p["module"], p["operator"], p["code"], p["col"]) for p in previous if p["outcome"] == "survived"}
        seen = {(p["module"], p["operator"], p["code"], p["col"]) for p in previous}
        # its survivors, and the mutants it never ran (past its budget, or of lines written since)
        mutants = [m for m in mutants if (m["module"], m["operator"], m["code"], m["col"]) in key
                   or (m["module"], m["operator"], m["code"], m["col"]) not in seen]
    random.Random(0).shuffle(mutants)
    print(f"{len(mutants)} mutants selected ({dict(Counter(m['module'] for m in mutants))}); left out: {dict(left)}",
          flush=True)
    if args.list:
        return
    t0 = time.monotonic()
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="pairflow-mutation-") as tmp:
        workers: queue.Queue[Worker] = queue.Queue()
        started = [Worker(Path(tmp) / f"w{i}", args.python, args.coverage_lib) for i in range(args.workers)]
        cov_file = Path(tmp) / "coverage.data"

        def baseline(w: Worker) -> tuple[int, str]:  # the unmutated tests pass; the first copy measures coverage
            env = {"PAIRFLOW_MUTATION_COVERAGE": str(cov_file)} if w is started[0] and args.coverage_lib else None
            return w.pytest(_pytest_args("inference"), args.timeout, env)

        with concurrent.futures.ThreadPoolExecutor(args.workers) as pool:
            for w, (rc, log) in zip(started, pool.map(baseline, started), strict=True):
                if rc != 0:
                    sys.exit(f"the tests fail before any mutation (exit {rc}):\n{log[-3000:]}")
                workers.put(w)
        cov: dict[str, Any] | None = None
        if args.coverage_lib:
            cov = json.loads(Path(f"{cov_file}.json").read_text())
            cov["lines"] = {f.replace(str(started[0].copy) + "/", ""): v for f, v in cov["lines"].items()}
        print(f"baseline passes in {time.monotonic() - t0:.0f} s"
              + (f" ({len(cov['order'])} tests, coverage per test)" if cov else ""), flush=True)

        def work(m: dict[str, Any]) -> dict[str, Any]:
            if time.monotonic() - t0 > 60 * args.budget:
                return {**m, "outcome": "not run (budget)"}
            tests = reaching(m, cov["lines"], cov["order"]) if cov else None
            w = workers.get()
            try:
                return run_one(m, w, args.timeout, tests)
            finally:
                workers.put(w)

        with concurrent.futures.ThreadPoolExecutor(args.workers) as pool:
            for i, r in enumerate(pool.map(work, mutants), 1):
                results.append(r)
                if r["outcome"] not in ("killed", "not run (budget)"):
                    print(f"[{i}/{len(mutants)}] {r['outcome']}: {r['file']}:{r['line']} {r['operator']} "
                          f"{r['code']!r} -> {r.get('mutated')!r}", flush=True)
        for w in started:
            w.close()
    if args.rerun:
        done = {(r["module"], r["operator"], r["code"], r["col"]): r for r in results}
        had = {(p["module"], p["operator"], p["code"], p["col"]) for p in previous}
        # A previous mutant of a line that is gone (rewritten since) is dropped, not kept with its old outcome.
        results = ([done.get((p["module"], p["operator"], p["code"], p["col"]), p) for p in previous
                    if p["module"] not in args.modules or (p["module"], p["operator"], p["code"], p["col"]) in current]
                   + [r for k, r in done.items() if k not in had])
    score = {}
    for module in sorted({r["module"] for r in results}):
        rs = [r for r in results if r["module"] == module and r["outcome"].startswith(("killed", "survived"))]
        killed = sum(r["outcome"].startswith("killed") for r in rs)
        score[module] = {"killed": killed, "total": len(rs)}
    total = {"killed": sum(s["killed"] for s in score.values()), "total": sum(s["total"] for s in score.values())}
    out = {"tool": f"cosmic-ray {version('cosmic-ray')}", "python": args.python,
           "command": "pytest " + " ".join(_pytest_args("inference")).replace("test_inference.py", "<own>.py", 1),
           "per_mutant": ("the tests that run the mutated statement (coverage.py, one context per test, caches "
                          "cleared before each), its own module's tests first; every test for a statement run at "
                          "import" if cov else "every analysis test"),
           "selection": {"operators": list(OPERATORS), "formula_functions": {k: sorted(v) for k, v in
                                                                                FORMULA_FUNCTIONS.items()},
                         "left_out": dict(left)},
           "seconds": round(time.monotonic() - t0), "score": score, "total": total,
           "not_run": sum(r["outcome"].startswith("not run") for r in results),
           "mutants": sorted((r for r in results if not r["outcome"].startswith("not run")),
                             key=lambda r: (r["module"], r["line"], r["col"], r["operator"]))}
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    for module, s in score.items():
        print(f"{module}: {s['killed']}/{s['total']} killed")
    print(f"total: {total['killed']}/{total['total']} killed ({100 * total['killed'] / max(1, total['total']):.1f}%) "
          f"in {out['seconds']} s; survivors:")
    for r in out["mutants"]:
        if r["outcome"] == "survived":
            print(f"  {r['file']}:{r['line']} {r['function']} {r['operator']}: {r['code']!r} -> {r['mutated']!r}")


if __name__ == "__main__":
    main()
