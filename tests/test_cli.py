"""cli and the Snakefile's entry: every entry point gives the same answer about a config,
``--configfile`` means that file alone, and verify's dispatch, exit codes and messages."""

from __future__ import annotations

import argparse
import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, copy_project, generation_record

from pairflow.cli import main
from pairflow.evidence.archive import promote
from pairflow.records.store import write_record

SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
PAIRFLOW = str(Path(sys.executable).with_name("pairflow"))


def project_with(tmp_path: Path, mutate) -> tuple[Path, Path]:  # type: ignore[no-untyped-def]
    project = copy_project(tmp_path / "p")
    (project / "config" / "panels").mkdir(parents=True)
    for sheet in ("smoke.tsv", "motion.tsv"):
        (project / "config" / "panels" / sheet).write_text((ROOT / "config" / "panels" / sheet).read_text())
    cfg = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    mutate(cfg)
    path = project / "config" / "one.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return project, path


def test_check_config_and_snakemake_give_the_same_one_line_answer(tmp_path: Path, tiny_model: Path) -> None:
    """A cache parameter of the wrong type used to pass check-config and fail after the
    model loaded with a bare TypeError; now check-config refuses it up front, and a run
    refuses it in its arms' check (rule check_arms, a job of its own so that planning
    never imports diffusers) before any generation starts, naming arm and key. (The
    session's tiny model stands in for the default's, which the run would build first.)"""
    def bad_threshold(c: dict) -> None:
        c["arms"]["fbcache"]["cache"]["params"].update(threshold="high")
        c["model"]["path"] = str(tiny_model)

    project, path = project_with(tmp_path, bad_threshold)
    check = subprocess.run([PAIRFLOW, "check-config", str(path)], capture_output=True, text=True, timeout=120,
                           check=False)
    run = subprocess.run([SNAKEMAKE, "--cores", "1", "--configfile", "config/one.yaml"], cwd=project,
                         capture_output=True, text=True, timeout=300, check=False)
    want = "key 'arms/fbcache/cache/params/threshold' is 'high' (str); FirstBlockCacheConfig expects float"
    assert check.returncode == 3 and want in check.stderr, check.stderr
    log = (project / "results" / "scratch" / "logs" / "check_arms.log").read_text()
    assert run.returncode != 0 and want in run.stdout + run.stderr and want in log
    assert "jsonschema" not in run.stdout + run.stderr
    assert not (project / "results" / "scratch" / "panels").exists()  # no generation job started


def test_configfile_replaces_the_default_config(tmp_path: Path) -> None:
    """A config with one panel plans that panel only (Snakemake's default merge kept the other)."""
    def one_panel(c: dict) -> None:
        del c["panels"]["motion"]
        c["storage"] = {"scratch": "elsewhere/scratch", "work": "elsewhere/work"}

    project, _ = project_with(tmp_path, one_panel)
    dry = subprocess.run([SNAKEMAKE, "-n", "--configfile", "config/one.yaml"], cwd=project, capture_output=True,
                         text=True, timeout=300, check=False)
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert "panels/smoke/generation.json" in dry.stdout and "elsewhere/scratch" in dry.stdout
    assert "motion" not in dry.stdout and "results/scratch" not in dry.stdout

def test_verify_without_a_recorded_config_names_the_fix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "panels").mkdir()
    assert main(["verify", str(tmp_path)]) == 3
    err = capsys.readouterr().err
    assert f"{tmp_path}: no manifest records the study config" in err
    assert f"pairflow verify {tmp_path} --configfile config/config.yaml" in err


def test_verify_of_a_path_that_is_not_a_results_tree_says_so_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression (issue 26): with --configfile, a wrong path gave 174 'record is missing' lines."""
    monkeypatch.chdir(ROOT)
    for path, what in ((tmp_path / "nope", "does not exist"), (tmp_path, "is not a results tree")):
        assert main(["verify", str(path), "--configfile", "config/config.yaml"]) == 3
        out, err = capsys.readouterr()
        assert out == "" and len(err.splitlines()) == 1 and f"{path} {what}" in err
        assert "storage.scratch folder" in err
        assert main(["export", str(path)]) == 3
        assert len(capsys.readouterr().err.splitlines()) == 1


def test_half_written_snapshot_is_reported_as_such(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A promotion killed before ``archive.json`` leaves an incomplete snapshot: verify
    says so (and how to finish or retire it), and ``--json`` carries the same finding."""
    scratch, work = tmp_path / "scratch", tmp_path / "work"
    record = generation_record("p", "a", 0, "control", 1, "v")
    record["video"]["path"] = "videos/control/a-s0.mp4"
    write_record(scratch / "panels/p/records/control/a-s0.json", record)
    promote(scratch, work)
    half = work / "snapshots" / "0123456789abcdef"
    (half / "study").mkdir(parents=True)
    (half / "study" / "table.md").write_text("| a |\n")
    assert main(["verify", str(work)]) == 1
    assert capsys.readouterr().out.splitlines() == [
        (f"snapshot: {half}: incomplete snapshot: no archive.json (promotion was interrupted); rerun the workflow to "
        f"finish it (or, if the evidence changed since, remove it), or retire it: pairflow archive retire {half.name} --why \"...\""),
        f"verify {work}: 1 problem(s)"]
    assert main(["verify", str(work), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False and [p["kind"] for p in report["problems"]] == ["snapshot"]
    snap = work / json.loads((work / "latest.json").read_text())["snapshot"]
    assert main(["verify", str(snap)]) == 0 and capsys.readouterr().out == f"verify {snap}: OK\n"


def test_version_help_and_exit_codes_follow_conventions(capsys: pytest.CaptureFixture[str]) -> None:
    """--version; every subcommand and argument has help; the top-level help has examples
    and no raw RST; a refused input (3) is told apart from argparse's usage error (2)."""
    from pairflow.cli import EXIT_REFUSED, EXIT_USAGE, _parser

    with pytest.raises(SystemExit) as ex:
        main(["--version"])
    assert ex.value.code == 0 and capsys.readouterr().out.startswith("pairflow 0.")
    parser = _parser()
    text = parser.format_help()
    assert "examples:" in text and "exit codes" in text and "``" not in text
    sub = next(a for a in parser._actions if a.choices and "verify" in a.choices)
    helps = {a.dest: a.help for a in sub._choices_actions}
    for name, cmd in sub.choices.items():
        assert helps.get(name) and cmd.description, name
        for action in cmd._actions:
            assert action.help, (name, action.dest)
    with pytest.raises(SystemExit) as ex:
        main(["verify"])  # missing PATH: argparse's usage error
    assert ex.value.code == EXIT_USAGE != EXIT_REFUSED


COMMAND = re.compile(r"pairflow ((?:archive )?[a-z][a-z-]+)([^`\"|)]*)")


def quoted_texts() -> list[tuple[str, str]]:
    """Every line of every string in the package (implicit concatenations joined, f-string
    fields as X) and of the rules and docs: where a message or a doc names a command."""
    out = []
    for f in sorted((ROOT / "workflow").rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                text = node.value
            elif isinstance(node, ast.JoinedStr):
                text = "".join(v.value if isinstance(v, ast.Constant) else "X" for v in node.values)
            else:
                continue
            out += [(f.name, line) for line in text.splitlines()]
    for f in [*sorted((ROOT / "workflow").rglob("*.smk")), ROOT / "README.md", ROOT / "config" / "README.md",
              *sorted((ROOT / "docs").rglob("*.md"))]:
        out += [(f.name, line) for line in f.read_text().splitlines()]
    return out


def test_every_flag_a_message_or_doc_gives_a_pairflow_command_exists() -> None:
    """check-config's message once suggested a --configfile it did not take: every
    ``pairflow <command> ... --flag`` written in the package, the rules or the docs names
    an option that command accepts (up to a bare ``--``, after which flags go to snakemake)."""
    from pairflow.cli import _parser

    def options(parser: argparse.ArgumentParser, words: list[str]) -> set[str]:
        for w in words:
            sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
            parser = sub.choices[w]
        return {o for a in parser._actions for o in a.option_strings}

    checked = 0
    for name, line in quoted_texts():
        for m in COMMAND.finditer(line):
            words = m.group(1).split()
            flags = []
            for tok in m.group(2).split():
                tok = tok.strip("[],.;:'\"`")  # a quoted command ends in its quote
                if tok == "--":
                    break
                if tok.startswith("-"):
                    flags.append(tok.split("=")[0])
            if not flags:
                continue
            accepted = options(_parser(), words)
            for flag in flags:
                assert flag in accepted, f"{name}: 'pairflow {m.group(1)} {flag}' names a flag it does not take: {line}"
                checked += 1
    assert checked >= 15  # the scan sees the commands the docs and messages name


def test_check_config_takes_the_config_as_every_other_command_does(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """The config positionally (as before) or as --configfile (as status, verify,
    rerun-panel and snakemake take it); two different ones are refused."""
    project, path = project_with(tmp_path, lambda c: None)
    assert main(["check-config", "--configfile", str(path), "--directory", str(project)]) == 0
    assert f"{path}: OK, study tiny-default" in capsys.readouterr().out
    assert main(["check-config", str(path), "--configfile", str(project / "config" / "x.yaml")]) == 3
    assert "give one" in capsys.readouterr().err
    assert main(["check-config", str(path), "--directory", str(tmp_path / "nowhere")]) == 3
    assert "--directory" in capsys.readouterr().err


def test_check_config_refuses_an_arm_named_as_a_windows_device(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 40: arm names CON and NUL were accepted; each names folders of the tree."""
    project = default_text_project(tmp_path, DEFAULT_TEXT.replace("  fewstep:", "  NUL:"))
    assert main(["check-config", str(project / "config" / "one.yaml"), "--directory", str(project)]) == 3
    err = capsys.readouterr().err
    assert (f"error: {project / 'config' / 'one.yaml'}: key 'arms/NUL': arm name 'NUL' is a device name Windows "
            "reserves (CON, PRN, AUX, NUL, COM0-9, LPT0-9, in any case), and it names a folder of the results tree, "
            "which could then not be copied there; rename the arm\n") == err


@pytest.mark.parametrize("argv, shown", [
    (["build-tiny-model", "/proc/x/model"], "OUT /proc/x/model (in /proc/x)"),
    (["build-test-mirror", "/proc/x/mirror"], "DEST /proc/x/mirror"),
    (["probe-slots", "--out", "/proc/x/probe.json"], "--out /proc/x/probe.json (in /proc/x)")])
def test_every_output_path_that_cannot_be_written_is_refused_in_one_line_before_any_work(
        argv: list[str], shown: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 40: an output path under /proc ended in a raw traceback (export's --out,
    tested in test_export); every command that writes to a path refuses it first."""
    assert main(argv) == 3
    err = capsys.readouterr().err
    assert err == (f"error: cannot write {shown}: creating a file in /proc failed (No such file or directory); give "
                   "a path on a file system this user can write (missing folders are created)\n")


def default_text_project(tmp_path: Path, text: str, sheet: bytes | None = None) -> Path:
    """A project whose config/one.yaml is ``text`` as written (not re-dumped: a key
    written twice must reach the loaders) and whose smoke sheet is ``sheet``."""
    project, _ = project_with(tmp_path, lambda c: None)
    (project / "config" / "one.yaml").write_text(text)
    if sheet is not None:
        (project / "config" / "panels" / "smoke.tsv").write_bytes(sheet)
    return project


DEFAULT_TEXT = (ROOT / "config" / "config.yaml").read_text()
BAD_INPUTS = {
    "an arm written twice": (DEFAULT_TEXT.replace("  fewstep:", "  fbcache:\n    steps: 3\n  fewstep:"), None,
                             "key 'arms/fbcache' is written twice, at lines 17 and 21"),
    "study written twice": (DEFAULT_TEXT + "study: renamed\n", None, "key 'study' is written twice, at lines 4 and"),
    "a ten-megabyte prompt": (DEFAULT_TEXT, b"prompt_id\tprompt\nbig\t" + b"x" * 10_000_000 + b"\n",
                              "config/panels/smoke.tsv:2: prompt 'big' is 10000000 bytes, over the 8192-byte limit"),
    "invalid UTF-8": (DEFAULT_TEXT, b"prompt_id\tprompt\na\tfine\nb\tcaf\xe9\n",
                      "config/panels/smoke.tsv:3: byte 6 (0xe9) is not valid UTF-8"),
    "a ragged row": (DEFAULT_TEXT, b"prompt_id\tprompt\na\tred\tfox\n",
                     "config/panels/smoke.tsv:2: expected 2 tab-separated fields (prompt_id, prompt), got 3"),
    "a binary sheet": (DEFAULT_TEXT, bytes(range(256)), "config/panels/smoke.tsv:1: byte 1 is a NUL byte"),
    "prompt ids differing by case": (DEFAULT_TEXT, b"prompt_id\tprompt\np01\ta fox\nP01\ta wave\n",
                                     "config/panels/smoke.tsv:3: prompt_id 'P01' differs from 'p01' (line 2) only "
                                     "by case"),
}


@pytest.mark.parametrize("name", sorted(BAD_INPUTS))
def test_a_bad_config_or_sheet_gets_one_message_and_exit_3_from_check_config_and_snakemake(tmp_path: Path,
                                                                                            name: str) -> None:
    """Both entry points refuse with the same message (file, line, fix) and exit code 3;
    neither prints a traceback. Snakemake's own loader keeps the last of two equal keys,
    so the rules read the file(s) again."""
    text, sheet, want = BAD_INPUTS[name]
    project = default_text_project(tmp_path, text, sheet)
    check = subprocess.run([PAIRFLOW, "check-config", "config/one.yaml"], cwd=project, capture_output=True,
                           text=True, timeout=120, check=False)
    run = subprocess.run([SNAKEMAKE, "-n", "--cores", "1", "--configfile", "config/one.yaml"], cwd=project,
                         capture_output=True, text=True, timeout=300, check=False)
    assert check.returncode == 3 and want in check.stderr, check.stderr[-2000:]
    assert run.returncode == 3 and want in run.stdout + run.stderr, (run.stdout + run.stderr)[-2000:]
    message = next(line for line in check.stderr.splitlines() if want in line)
    assert message in (run.stdout + run.stderr).splitlines()  # the same line, word for word
    for out in (check.stderr, run.stdout + run.stderr):
        assert "Traceback" not in out and 'File "' not in out and len(out) < 4000


def test_check_config_and_snakemake_resolve_relative_paths_against_the_working_directory(tmp_path: Path) -> None:
    """A config kept outside config/ (studies/a.yaml): its relative paths are the
    project's, in check-config (from the project, or elsewhere with --directory) as in
    Snakemake. A sheet written relative to the config's own folder is refused by both."""
    project, _ = project_with(tmp_path, lambda c: None)
    (project / "studies" / "panels").mkdir(parents=True)
    (project / "studies" / "a.yaml").write_text(DEFAULT_TEXT)
    check = subprocess.run([PAIRFLOW, "check-config", "studies/a.yaml"], cwd=project, capture_output=True,
                           text=True, timeout=120, check=False)
    assert check.returncode == 0 and f"resolved against {project.resolve()}" in check.stdout, check.stderr
    # from elsewhere (this test's working directory), naming the directory snakemake runs in
    assert main(["check-config", str(project / "studies" / "a.yaml"), "--directory", str(project)]) == 0
    run = subprocess.run([SNAKEMAKE, "-n", "--cores", "1", "--configfile", "studies/a.yaml"], cwd=project,
                         capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0 and "results/scratch/panels/smoke/generation.json" in run.stdout, run.stderr[-2000:]
    # relative to the config's folder: exists at studies/panels/, not at the project's panels/
    (project / "studies" / "panels" / "own.tsv").write_text("prompt_id\tprompt\na\ta red fox\n")
    (project / "studies" / "b.yaml").write_text(DEFAULT_TEXT.replace("config/panels/smoke.tsv", "panels/own.tsv"))
    want = f"prompt sheet {project.resolve() / 'panels' / 'own.tsv'} does not exist"
    check = subprocess.run([PAIRFLOW, "check-config", "studies/b.yaml"], cwd=project, capture_output=True,
                           text=True, timeout=120, check=False)
    run = subprocess.run([SNAKEMAKE, "-n", "--cores", "1", "--configfile", "studies/b.yaml"], cwd=project,
                         capture_output=True, text=True, timeout=300, check=False)
    assert check.returncode == 3 and want in check.stderr, check.stderr
    assert run.returncode == 3 and want in run.stdout + run.stderr, (run.stdout + run.stderr)[-2000:]


def test_estimate_reads_the_table_and_refuses_over_budget(tmp_path: Path, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    """`pairflow estimate` never measures: without the table it says how to make it (exit 3);
    with one it prints slot-seconds per stage and arm, and exits 3 over the budget."""
    import copy

    from conftest import small_config, write_config

    from pairflow.budget.calibrate import FORMAT, key, table_path
    from pairflow.plan.config import study_from_raw

    cfg = small_config(tmp_path, tmp_path / "model", fleet={"cpu_workers": 1, "retries": 1, "budget_gpu_hours": 1e-6})
    write_config(tmp_path, cfg)
    monkeypatch.chdir(tmp_path)
    assert main(["estimate"]) == 3
    assert "no calibration table" in capsys.readouterr().err
    study = study_from_raw(copy.deepcopy(cfg), tmp_path, source="test")
    phase = {"s": 1.0, "peak_rss_mb": 900.0, "peak_device_mb": None}
    arm = {"generate_s": 2.0, "score_s": 0.5, "timed_s": 1.5, "phases": {"load": phase, "encode": phase}}
    table = {"kind": "calibration", "format": FORMAT, "key": key(study), "device": "cpu",
             "import": phase, "arms": {"control": arm, "pab": arm}}
    path = table_path(study)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(table))
    assert main(["estimate"]) == 3
    out = capsys.readouterr()
    assert "generate" in out.out and "control 4.0" in out.out and "EXCEEDED" in out.out
    assert "over fleet/budget_gpu_hours = 1e-06 in config/config.yaml" in out.err


def test_check_config_names_each_panel_too_small_for_any_verdict(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 39: at 5 prompts or fewer the exact sign-flip test decides and its smallest p
    (2 / 2^n) cannot reach the level, so a panel that small gets no verdict; check-config
    says so before the study runs, naming the panel, its count and the count that allows one."""
    project, path = project_with(tmp_path, lambda c: c["stats"].update(multiplicity="bh"))
    assert main(["check-config", str(path), "--directory", str(project)]) == 0
    err = capsys.readouterr().err
    assert "warning: panel 'motion' has 3 prompts: no verdict is possible" in err
    assert "warning: panel 'smoke' has 4 prompts: no verdict is possible" in err
    assert "smallest p, 0.125, is not below 0.05" in err and "6 prompts would allow one" in err
    project, path = project_with(tmp_path / "b", lambda c: c["stats"].update(level=0.8, multiplicity="bh"))
    assert main(["check-config", str(path), "--directory", str(project)]) == 0
    err = capsys.readouterr().err  # at alpha 0.2: 4 prompts reach p = 0.125
    assert "'motion' has 3 prompts" in err and "'smoke'" not in err.replace("'smoke' has 4 prompts: a quantised", "")


def test_the_console_shows_pairflows_lines_and_library_warnings_but_not_library_chatter(
        tmp_path: Path, tiny_model: Path) -> None:
    """Regression (issue 41): every check-config began with bitsandbytes' warning that an
    optional 4-bit CPU kernel is not in the offline cache (bitsandbytes is imported with
    diffusers' models by the arms' check, where this machine's CPU has AVX512-BF16). The
    console's filter keeps PairFlow's lines from INFO, other libraries' from WARNING (no
    Parsl INFO), and ``CHATTER`` libraries' from ERROR."""
    import logging

    from conftest import small_config, write_config

    from pairflow.cli import on_console

    def shown(name: str, level: int) -> bool:
        return on_console(logging.LogRecord(name, level, __file__, 1, "m", None, None))

    assert shown("pairflow.stages.timing", logging.INFO) and not shown("parsl.dataflow.dflow", logging.INFO)
    assert shown("parsl.dataflow.dflow", logging.WARNING) and shown("torch", logging.WARNING)
    assert not shown("bitsandbytes.backends.cpu.ops", logging.WARNING)
    assert shown("bitsandbytes.backends.cpu.ops", logging.ERROR)
    path = write_config(tmp_path, small_config(tmp_path, tiny_model))  # a cache arm: the check imports diffusers
    check = subprocess.run([PAIRFLOW, "check-config", str(path)], capture_output=True, text=True, timeout=300,
                           check=False)
    assert check.returncode == 0 and f"{path}: OK" in check.stdout, check.stderr[-2000:]
    assert "gemm_4bit" not in check.stderr and "bitsandbytes" not in check.stderr, check.stderr


@pytest.mark.parametrize("where", ["model", "student"])
def test_check_config_and_the_dry_run_refuse_a_model_nothing_builds(tmp_path: Path, tiny_model: Path,
                                                                     where: str) -> None:
    """Issue 41: a model path pointing at nothing passed check-config (OK, exit 0) and the
    dry run, and the first job failed 13 s later. Both refuse it now with the same line,
    naming the key, the folder and a fix, before any job."""
    def missing(c: dict) -> None:
        if where == "model":
            c["model"] = {"kind": "local", "path": "models/none"}
        else:
            c["model"]["path"] = str(tiny_model)
            c["arms"]["student"] = {"model": {"path": "models/none"}}

    project, path = project_with(tmp_path, missing)
    key = "model/path" if where == "model" else "arms/student/model/path"
    want = f"key '{key}' names the local model {project.resolve() / 'models' / 'none'}, which does not exist; point"
    check = subprocess.run([PAIRFLOW, "check-config", "config/one.yaml"], cwd=project, capture_output=True,
                           text=True, timeout=120, check=False)
    dry = subprocess.run([SNAKEMAKE, "-n", "--profile", "profiles/local", "--configfile", "config/one.yaml"],
                         cwd=project, capture_output=True, text=True, timeout=300, check=False)
    assert check.returncode == 3 and want in check.stderr, check.stderr[-2000:]
    assert dry.returncode == 3 and want in dry.stdout + dry.stderr, (dry.stdout + dry.stderr)[-2000:]
    message = next(line for line in check.stderr.splitlines() if want in line)
    assert message in (dry.stdout + dry.stderr).splitlines()  # the same line, word for word
    assert "build_tiny_model" not in dry.stdout  # no job planned


def test_check_config_passes_the_embedded_model_a_rule_builds_and_names_the_command(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    project, path = project_with(tmp_path, lambda c: None)
    assert main(["check-config", str(path), "--directory", str(project)]) == 0
    err = capsys.readouterr().err
    assert (f"note: model {project.resolve() / 'resources' / 'tiny-wan'} (model/path) is not built yet: a run builds "
            f"it first (rule build_tiny_model), and checks every arm against it then; to build it now: snakemake "
            f"--profile profiles/local build_tiny_model (in {project.resolve()})") in err.splitlines()


def test_every_command_that_reads_a_config_works_from_another_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 41: from another folder, check-config with an absolute config path told the
    user to create a sheet that exists (it resolved against the current folder); status
    had no --directory. Each command takes --directory as snakemake does, finds the
    project of a config in its config/ folder, or says exactly where to run it."""
    project, _ = project_with(tmp_path, lambda c: None)
    config = project / "config" / "config.yaml"
    config.write_text(DEFAULT_TEXT)
    project = project.resolve()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    # the config's own project, said, never "create it"
    assert main(["check-config", str(config)]) == 0
    out, err = capsys.readouterr()
    assert (f"relative paths resolved against {project} (the project holding the config, where snakemake runs; the "
            f"current directory {elsewhere.resolve()} holds no Snakefile)") in out and "create it" not in err
    # the default config: in --directory, else said where to run
    assert main(["status"]) == 3
    assert capsys.readouterr().err == (
        f"error: no config/config.yaml in {elsewhere.resolve()} (the current directory): run pairflow in the project "
        "folder (the one holding the Snakefile, where snakemake runs), or give --directory PROJECT or --configfile "
        "FILE\n")
    assert main(["status", "--directory", str(project), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["total"] == 168
    assert main(["status", "--configfile", str(config), "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["total"] == 168 and f"resolve against {project}" in err
    # a relative --configfile starts here, as snakemake's does; the message gives the path meant
    assert main(["status", "-d", str(project), "--configfile", "config/config.yaml"]) == 3
    assert f"starts in the current directory {elsewhere.resolve()}, as snakemake's does; give {config}" in \
        capsys.readouterr().err
    # the others read the project's study
    assert main(["estimate", "-d", str(project)]) == 3
    assert f"no calibration table for study 'tiny-default' at {project / 'results' / 'scratch'}" in \
        capsys.readouterr().err
    assert main(["archive", "retire", "s1", "--why", "test", "-d", str(project)]) == 3
    assert f"no snapshot 's1' under {project / 'results' / 'work' / 'tiny-default' / 'snapshots'}" in \
        capsys.readouterr().err
    assert main(["rerun-panel", "smoke", "-d", str(project), "--", "-n", "--cores", "1"]) == 0
    assert (f"running in {project}: {SNAKEMAKE} --configfile config/config.yaml --forcerun "
            "results/scratch/panels/smoke/generation.json -n --cores 1") in capsys.readouterr().out
    # a config outside any project's config/: the sheet's message names the folder it resolved against
    (elsewhere / "a.yaml").write_text(DEFAULT_TEXT)
    assert main(["check-config", "a.yaml"]) == 3
    assert (f"prompt sheet {elsewhere.resolve() / 'config' / 'panels' / 'smoke.tsv'} does not exist ('panels/smoke/"
            f"sheet' is 'config/panels/smoke.tsv', resolved against {elsewhere.resolve()}, the directory snakemake runs "
            "in: run from the project folder, or give snakemake and pairflow --directory PROJECT)") in \
        capsys.readouterr().err
    assert main(["check-config", "a.yaml", "--directory", str(project)]) == 0


def test_the_own_prompts_recipe_makes_a_study_of_its_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 41: README's "My own prompts" (now docs/your-own-study.md) kept the default's
    study name and storage, so a user who had run the default study was told to rm -r its
    panels. Followed as written, the recipe's study has its own name and storage, disjoint
    from the default's."""
    docs = (ROOT / "docs" / "your-own-study.md").read_text()
    section = docs[docs.index("## My own prompts"):]
    section = section[:section.index("\n## ", 1)]
    assert "rm -r" not in section
    lines = section.splitlines()
    sheet = [ln.strip() for ln in lines if "\t" in ln]
    start = next(i for i, ln in enumerate(lines) if "# in config/mine.yaml, replace these three keys:" in ln)
    keys = yaml.safe_load("\n".join(ln.strip() for ln in lines[start + 1:start + 4]))
    assert set(keys) == {"study", "storage", "panels"}
    project, _ = project_with(tmp_path, lambda c: None)
    (project / "config" / "panels" / "mine.tsv").write_text("\n".join(sheet) + "\n")
    mine = {**yaml.safe_load(DEFAULT_TEXT), **keys}
    (project / "config" / "mine.yaml").write_text(yaml.safe_dump(mine))
    monkeypatch.chdir(project)
    assert main(["check-config", "config/mine.yaml"]) == 0
    assert "OK, study mine, 1 panel(s)" in capsys.readouterr().out
    from pairflow.plan.config import load_study

    default, own = (load_study(project / "config" / n, project) for n in ("one.yaml", "mine.yaml"))
    assert own.study != default.study
    for a in (own.scratch, own.work):
        for b in (default.scratch, default.work):
            assert a != b and a not in b.parents and b not in a.parents
