"""README and docs/: what they say is checked against the code and the files. The front
page stays short (issue 41: about 10 KB), quotes the answer line the table prints, gives the
two commands CI runs and links every docs page; every relative link and anchor in the
README, config/README.md and docs/ resolves. The Layout table (docs/layout.md) names every
module and package of ``workflow/pairflow`` and nothing that is not there; every module has
its test file (``tests/test_<module>.py``, or the file named in ``COVERED_BY``); every rule
script calls into ``pairflow.stages.steps`` only; the Snakefile's header names every rule."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "workflow" / "pairflow"
README = (ROOT / "README.md").read_text()
DOCS = ROOT / "docs"
LAYOUT = (DOCS / "layout.md").read_text()

COVERED_BY = {
    # module (path under workflow/pairflow, no .py) -> (its test file, a word that file must use)
    "records/packs": ("test_archive.py", "from pairflow.records import packs"),
    "fleet/workerpool": ("test_fleet.py", "pairflow.fleet.workerpool"),
    "fleet/preload": ("test_fleet.py", "pairflow.fleet.preload"),
    "fleet/executor": ("test_sites.py", "pairflow.fleet.executor"),
    "generation/provenance": ("test_generate.py", "pairflow.generation.provenance"),
    "records/types": ("test_records.py", "recordtypes"),
    "generation/armrun": ("test_arms.py", "pairflow.generation.armrun"),
    "specs": ("test_config.py", "pairflow.specs"),
    "generation/tinymodel": ("test_generate.py", "pairflow.generation.tinymodel"),
    # the metric registry and one module per metric: scored through the registry by name
    "metrics/__init__": ("test_scoring.py", "pairflow.metrics"),
    "metrics/aesthetic_quality": ("test_scoring.py", "aesthetic_quality"),
    "metrics/background_consistency": ("test_scoring.py", "background_consistency"),
    "metrics/dynamic_degree": ("test_scoring.py", "pairflow.metrics.dynamic_degree"),
    "metrics/fidelity": ("test_scoring.py", "pairflow.metrics.fidelity"),
    "metrics/flicker": ("test_scoring.py", "temporal_flickering"),
    "metrics/imaging_quality": ("test_scoring.py", "imaging_quality"),
    "metrics/models": ("test_scoring.py", "pairflow.metrics.models"),
    "metrics/motion_smoothness": ("test_scoring.py", "motion_smoothness"),
    "metrics/structural": ("test_scoring.py", "ms_ssim"),
    "metrics/subject_consistency": ("test_scoring.py", "pairflow.metrics.subject_consistency"),
    # arms/: the package, its registry and one module per kind, all tested through the
    # registry and the arms' check (a new kind's own test file is test_<kind>.py)
    "arms/base": ("test_arms.py", "KINDS"),
    "arms/check": ("test_arms.py", "check_arms"),
    "arms/registry": ("test_arms.py", "KINDS"),
    "arms/kinds/attention": ("test_arms.py", "attention"),
    "arms/kinds/cache": ("test_arms.py", "cache"),
    "arms/kinds/overrides": ("test_arms.py", "steps"),
    "arms/kinds/precision": ("test_arms.py", "precision"),
    "arms/kinds/search": ("test_arms.py", "search_seeds"),
    "arms/kinds/student": ("test_arms.py", "student"),
    # fleet/sites/: one module per place the work runs, tested together through the site seam
    "fleet/sites/accelerators": ("test_sites.py", "pairflow.fleet.sites.accelerators"),
    "fleet/sites/base": ("test_sites.py", "pairflow.fleet.sites.base"),
    "fleet/sites/local": ("test_sites.py", "SingleNodeLauncher"),
    # verify and heal: one test file for the evidence both read (test_evidence)
    "evidence/verification": ("test_evidence.py", "verification.check_results"),
    # the calibration worker: run for real by test_calibrate's calibrate() (a fresh process)
    "stages/calibworker": ("test_calibrate.py", "calibrate("),
    # the stages: each tested in the file of its stage
    "stages/generation": ("test_generate.py", "pairflow.stages.generation"),
    # a wing's module named by its concern, tested in the file of the concern
    "media/frames": ("test_video.py", "prepare_frames"),
    "media/recipe": ("test_video.py", "ffmpeg_binary"),
    "media/probe": ("test_video.py", "recipe_declaration"),
    "media/tools": ("test_video.py", "tool_timeout"),
    "fleet/pool": ("test_fleet.py", "pairflow.fleet.pool"),
    "records/store": ("test_records.py", "pairflow.records.store"),
    "stages/scoring": ("test_scoring.py", "pairflow.stages.scoring"),
    "stages/timing": ("test_timing.py", "pairflow.stages.timing"),
    "stages/combined": ("test_combined.py", "pairflow.stages.combined"),
}


def modules() -> list[str]:
    """Every module of the package, as a path under workflow/pairflow without .py
    (``stages/generation``; a package's own ``__init__`` only where it holds code)."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).with_suffix("").as_posix()
        body = ast.parse(path.read_text()).body
        if rel.endswith("__init__") and not any(isinstance(n, (ast.FunctionDef, ast.ClassDef)) for n in body):
            continue  # a package's docstring only
        out.append(rel)
    return out


def layout_rows() -> list[tuple[str, list[str]]]:
    """(concern, module names) of each row of the Layout table (docs/layout.md): the
    backticked names in its module column that look like modules (``stages/timing``) or
    packages (``metrics/``); class names and paths to other files are left out."""
    rows = []
    for line in LAYOUT.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 2 or cells[1] in ("module", "---"):
            continue
        names = [n for n in re.findall(r"`([^`]+)`", cells[1]) if re.fullmatch(r"[a-z][a-z0-9_]*(/[a-z0-9_]*)?", n)]
        rows.append((cells[0], names))
    return rows


def test_the_layout_table_names_every_module_and_package_and_nothing_else() -> None:
    rows = layout_rows()
    assert len(rows) > 10, "docs/layout.md's Layout table was not found"
    named = [n for _, ns in rows for n in ns]
    for name in named:  # a module (stages/timing) or a package (metrics/)
        exists = (PACKAGE / f"{name}.py").is_file() if not name.endswith("/") else (PACKAGE / name / "__init__.py").is_file()
        assert exists, f"docs/layout.md's Layout table names {name!r}, which workflow/pairflow does not have"
    missing = []
    for module in modules():
        name = module.removesuffix("/__init__")
        parts = name.split("/")
        covered = name in named or any(f"{'/'.join(parts[:i])}/" in named for i in range(1, len(parts) + 1))
        if not covered:
            missing.append(module)
    assert missing == [], f"add a row (or a name to a row) of docs/layout.md's Layout table for: {missing}"


def test_every_module_has_its_test_file() -> None:
    """docs/layout.md: `tests/test_<module>.py` per module, or the file named here."""
    assert "`tests/` (`tests/test_<module>.py` for each module" in LAYOUT
    missing = []
    for module in modules():
        mine = ROOT / "tests" / f"test_{module.removesuffix('/__init__').rsplit('/', 1)[-1]}.py"
        if module in COVERED_BY:
            name, word = COVERED_BY[module]
            assert not mine.exists() or mine.name == name, f"{module} has {mine.name}: drop it from COVERED_BY"
            assert word in (ROOT / "tests" / name).read_text(), f"{name} does not use {word} ({module})"
        elif not mine.exists():
            missing.append(module)
    assert missing == [], f"write tests/test_<module>.py (or name the covering file in COVERED_BY) for {missing}"
    stale = sorted(set(COVERED_BY) - set(modules()))
    assert stale == [], f"COVERED_BY names modules that no longer exist: {stale}"


def test_every_rule_script_calls_into_steps_only() -> None:
    """docs/layout.md: `stages/steps` is the one layer every rule script calls."""
    assert "`stages/steps` (the one layer every rule script calls)" in LAYOUT
    for script in sorted((ROOT / "workflow" / "scripts").glob("*.py")):
        imported = {node.module for node in ast.walk(ast.parse(script.read_text()))
                    if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("pairflow")}
        imported |= {a.name for node in ast.walk(ast.parse(script.read_text())) if isinstance(node, ast.Import)
                     for a in node.names if a.name.startswith("pairflow")}
        assert imported == {"pairflow.stages.steps"}, f"{script.name} imports {sorted(imported)}; call pairflow.stages.steps"


def test_the_snakefile_header_names_every_rule() -> None:
    lines = (ROOT / "Snakefile").read_text().splitlines()
    header = "\n".join(lines[:next(i for i, line in enumerate(lines) if not line.startswith("#"))])
    rules = {m for smk in (ROOT / "workflow" / "rules").glob("*.smk")
             for m in re.findall(r"^rule (\w+):", smk.read_text(), re.M)}
    assert len(rules) > 10
    missing = sorted(r for r in rules if not re.search(rf"\b{r}\b", header))
    assert missing == [], f"the Snakefile's header omits rule(s) {missing}"


FRONT_PAGE_MAX_BYTES = 10_752
"""Issue 41: the front page is "at most about 10 KB" (10.5 KiB); the manual is docs/."""

PAGES = ("index", "install-and-test", "results-and-reports", "configuration", "your-own-study", "arms",
         "metrics-and-verdicts", "clusters", "evidence-and-archive", "troubleshooting", "layout")
"""docs/, one page per concern (issue 41 names configuration, arms, metrics and verdicts,
clusters, evidence and archive, troubleshooting; the rest hold what the README held)."""

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
"""An inline Markdown link or image: its target."""


def test_the_front_page_is_short_and_links_every_docs_page() -> None:
    size = len(README.encode())
    assert size <= FRONT_PAGE_MAX_BYTES, (f"README.md is {size} bytes, over {FRONT_PAGE_MAX_BYTES}: move the "
                                          "detail into the docs page of its concern and link it")
    pages = sorted(p.stem for p in DOCS.glob("*.md"))
    assert pages == sorted(PAGES), f"docs/ holds {pages}; PAGES lists {sorted(PAGES)}: list a new page here and in docs/index.md"
    index = (DOCS / "index.md").read_text()
    for name in PAGES:
        assert f"(docs/{name}.md" in README, f"README.md does not link docs/{name}.md"
        assert name == "index" or f"({name}.md)" in index, f"docs/index.md does not list {name}.md"


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, code marks and punctuation dropped (but
    ``-`` and ``_``), spaces as ``-``."""
    text = heading.strip().lower().replace("`", "")
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors of a Markdown page's headings (fenced and indented code left out; a
    repeated heading gets GitHub's ``-1``, ``-2``)."""
    out: set[str] = set()
    fenced = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        m = None if fenced else re.match(r"#{1,6} (.+)", line)
        if m:
            slug = _slug(m.group(1))
            n = 0
            while (slug if n == 0 else f"{slug}-{n}") in out:
                n += 1
            out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def test_every_relative_link_and_anchor_in_the_readme_and_docs_resolves() -> None:
    """Links into docs/ (and between its pages) name files that exist and headings those
    files have; code (spans and indented blocks) is not read for links."""
    checked = 0
    for page in [ROOT / "README.md", ROOT / "config" / "README.md", *sorted(DOCS.glob("*.md"))]:
        text = "\n".join(line for line in page.read_text().splitlines() if not line.startswith("    "))
        for target in LINK.findall(re.sub(r"`[^`]*`", "", text)):
            if re.match(r"[a-z]+:", target):
                continue  # http:, https:, mailto:
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(ROOT)} links {target!r}"
            assert dest.exists(), f"{where}, but {dest.relative_to(ROOT)} does not exist"
            if anchor:
                assert anchor in anchors(dest), f"{where}, but {dest.name} has no heading with that anchor"
            checked += 1
    assert checked > 40


def test_the_front_page_answer_line_is_what_the_table_prints() -> None:
    """README.md quotes the answer line (the quoted ``> `` line) that report.table.answer
    prints for tests/data/readme_stats.json: the default study's stats.json, copied from a
    run on 2026-12-05 (iso_compute on), and checked against the stats schema here. When the
    line's wording changes, this fails with the new line to paste; when the schema does,
    rerun the default study and copy results/scratch/study/stats.json there."""
    from pairflow.records.store import check_schema
    from pairflow.report.table import answer

    path = ROOT / "tests" / "data" / "readme_stats.json"
    stats = json.loads(path.read_text())
    check_schema(stats, path, "read", name="stats")
    quoted = [line[2:] for line in README.splitlines() if line.startswith("> ")]
    assert len(quoted) == 1, f"README.md quotes {len(quoted)} answer lines; quote one"
    printed = answer(stats)
    assert quoted[0] in printed, f"README.md's answer line is not what the table prints; paste one of: {printed}"
    assert "![" in README and "docs/img/" in README, "the front page shows one screenshot from docs/img/"


def test_the_front_page_gives_the_two_commands_ci_runs() -> None:
    """The one command that sets up and runs the main job, and the one that sets up and
    passes the tests; .ci/run runs the second's two halves as written (after its lint)."""
    setup_and_run = "    bash workflow/setup.sh && .venv/bin/snakemake --profile profiles/local\n"
    setup_and_test = "    bash workflow/setup.sh test && .venv/bin/python -m pytest -q\n"
    assert setup_and_run in README and setup_and_test in README
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    for half in setup_and_test.strip().split(" && "):
        assert half in ci, f".ci/run does not run the README's {half!r} as written"
    assert ci.index("bash workflow/setup.sh test") < ci.index(".venv/bin/python -m pytest -q")
