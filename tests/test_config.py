from __future__ import annotations

import copy
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pairflow import specs
from pairflow.errors import ConfigError
from pairflow.plan import config
from pairflow.plan.config import load_study, load_yaml, read_sheet, study_from_raw

ROOT = Path(__file__).resolve().parents[1]


def default_raw() -> dict:
    return yaml.safe_load((ROOT / "config" / "config.yaml").read_text())


def test_default_config_loads_and_fills_defaults() -> None:
    s = load_study(ROOT / "config" / "config.yaml")
    assert s.study == "tiny-default"
    assert [a.name for a in s.arms][0] == "control"
    assert s.stats.missing == "error"  # filled from the schema default
    assert s.scratch == (ROOT / "results" / "scratch").resolve()


@pytest.mark.parametrize("mutate, words", [
    (lambda c: c.update(colour="blue"), ["colour", "not a PairFlow setting", "Allowed under"]),
    (lambda c: c.update(generaton={}), ["'generaton'", "did you mean 'generation'?"]),
    (lambda c: c["fleet"].update(retires=2) if "fleet" in c else c.update(fleet={"retires": 2}),
     ["'fleet/retires'", "did you mean 'retries'?"]),
    (lambda c: c["encoder"].update(preset="sloow"), ["encoder/preset", "did you mean 'slow'?"]),
    (lambda c: c["generation"].update(frames=10), ["generation/frames", "4k+1"]),
    (lambda c: c["generation"].update(height=60), ["generation/height", "multiple of 16"]),
    (lambda c: c["encoder"].update(preset="turbo"), ["encoder/preset", "turbo", "allowed"]),
    (lambda c: c["arms"].update({"../evil": {"cache": None}}), ["../evil", "allowed"]),
    (lambda c: c["arms"]["fbcache"].update({"cahce": None}), ["arms/fbcache/cahce", "did you mean 'cache'?"]),
    (lambda c: c["panels"].update({"a/b": {"sheet": "x.tsv", "seeds": [0]}}), ["a/b"]),
    (lambda c: c["panels"]["smoke"].update(seeds=[]), ["seeds"]),
    (lambda c: c.pop("arms"), ["arms", "required"]),
    (lambda c: c.update(study="x; rm -rf /"), ["study", "allowed"]),
    (lambda c: c.update(study="caf\u00e9"), ["study"]),
    (lambda c: c["model"].update(kind="hub-mirror"), ["model/id", "revision"]),
    (lambda c: c["stats"].update(margins={"lpips": 0.01}), ["margins", "lpips", "scorers"]),
    (lambda c: c["stats"].update(floors={"lpips": 0.3}), ["floors", "lpips", "scorers"]),
    (lambda c: c["stats"].update(margins={"ssim": 0}), ["margins", "ssim"]),
    (lambda c: c["stats"].update(multiplicity="bonferroni"), ["multiplicity", "bonferroni"]),
    (lambda c: c.update(scoring={"decode": "bt2020"}), ["decode", "bt2020"]),
    (lambda c: c["fleet"].update(allocation="per-node"), ["allocation", "per-node", "study"]),
    (lambda c: c["fleet"].update(allocation="study", panel_jobs="per-stage"),
     ["fleet/allocation", "'study'", "per-stage", "panel_jobs: combined"]),
])
def test_bad_config_names_key_value_and_allowed(mutate, words) -> None:  # type: ignore[no-untyped-def]
    raw = default_raw()
    mutate(raw)
    with pytest.raises(ConfigError) as e:
        study_from_raw(copy.deepcopy(raw), ROOT)
    for w in words:
        assert w in str(e.value), str(e.value)


def test_yaml_that_is_not_a_mapping_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="must be a YAML mapping, got list"):
        load_yaml(p)


def test_huge_yaml_is_refused_before_parsing(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("a: " + "x" * (2 << 20) + "\n")
    with pytest.raises(ConfigError, match="over the 1048576-byte limit"):
        load_yaml(p)


@pytest.mark.parametrize("pid", ["../x", "/etc/passwd", "a b", "a;b", "a\u00e9", "a.b", "$(x)"])
def test_hostile_prompt_ids_are_refused(tmp_path: Path, pid: str) -> None:
    sheet = tmp_path / "s.tsv"
    sheet.write_text(f"prompt_id\tprompt\n{pid}\tsome prompt\n")
    with pytest.raises(ConfigError, match="is not allowed"):
        read_sheet(sheet, "p")


def test_prompt_text_may_hold_anything_safe(tmp_path: Path) -> None:
    sheet = tmp_path / "s.tsv"
    sheet.write_text("prompt_id\tprompt\nok\t$(rm -rf /); `x` \u00e9t\u00e9 \"q\"\n")
    (p,) = read_sheet(sheet, "p")
    assert p.text.startswith("$(rm -rf /)")


def test_duplicate_prompt_id_and_bad_header(tmp_path: Path) -> None:
    sheet = tmp_path / "s.tsv"
    sheet.write_text("prompt_id\tprompt\na\tx\na\ty\n")
    with pytest.raises(ConfigError, match="appears twice"):
        read_sheet(sheet, "p")
    sheet.write_text("id\ttext\na\tx\n")
    with pytest.raises(ConfigError, match="first line"):
        read_sheet(sheet, "p")


def test_prompt_ids_that_differ_only_by_case_are_refused_naming_both_lines(tmp_path: Path) -> None:
    """p01 and P01 are one file on a case-insensitive file system (issue 40)."""
    sheet = tmp_path / "s.tsv"
    sheet.write_text("prompt_id\tprompt\np01\tx\np02\ty\nP01\tz\n")
    with pytest.raises(ConfigError) as e:
        read_sheet(sheet, "p")
    assert str(e.value) == (f"{sheet}:4: prompt_id 'P01' differs from 'p01' (line 2) only by case; each names files "
                            "of the results tree, and on a case-insensitive file system (macOS, Windows, SMB shares "
                            "and some object stores) their files are one file; rename one of them")


@pytest.mark.parametrize("where, name", [("arms", "CON"), ("arms", "nul"), ("arms", "Com1"), ("panels", "LPT9"),
                                         ("panels", "aux"), ("study", "PRN")])
def test_reserved_device_names_are_refused_naming_the_key_and_the_fix(where: str, name: str) -> None:
    raw = default_raw()
    if where == "study":
        raw["study"] = name
    else:
        raw[where][name] = raw[where].pop("fewstep" if where == "arms" else "motion")
    key = "study" if where == "study" else f"{where}/{name}"
    with pytest.raises(ConfigError, match=rf"^x.yaml: key '{key}': \w+ name '{name}' is a device name Windows "
                       r"reserves \(CON, PRN, AUX, NUL, COM0-9, LPT0-9, in any case\).*; rename the \w+$"):
        study_from_raw(raw, ROOT, source="x.yaml")


def test_reserved_name_reads_any_case_and_extension_and_only_whole_names() -> None:
    assert all(config.reserved_name(n) for n in ("CON", "con", "Nul", "COM0", "lpt9", "NUL.json", "aux.tar.gz"))
    assert not any(config.reserved_name(n) for n in ("CONS", "control", "COM10", "p01", "nul-arm", "LPT"))


@pytest.mark.parametrize("where", ["arms", "panels"])
def test_arm_and_panel_names_that_differ_only_by_case_are_refused(where: str) -> None:
    raw = default_raw()
    name = "fewstep" if where == "arms" else "motion"
    raw[where][name.upper()] = copy.deepcopy(raw[where][name])
    what = where[:-1]
    with pytest.raises(ConfigError) as e:
        study_from_raw(raw, ROOT, source="x.yaml")
    assert str(e.value) == (f"x.yaml: {what}s {name!r} ({where}/{name}) and {name.upper()!r} ({where}/{name.upper()}) "
                            "differ only by case; each names a folder of the results tree, and on a case-insensitive "
                            "file system (macOS, Windows, SMB shares and some object stores) the two are one folder; "
                            "rename one of them")


def test_missing_sheet_names_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        read_sheet(tmp_path / "nope.tsv", "p")


def test_storage_outside_the_project_through_a_symlink_is_resolved(tmp_path: Path) -> None:
    """A scratch root that is a symlink to another file system resolves to its real path
    once, so every later path is built under the real directory, never re-joined to '..'."""
    import os

    real = tmp_path / "cluster-scratch"
    real.mkdir()
    project = tmp_path / "proj"
    (project / "config" / "panels").mkdir(parents=True)
    os.symlink(real, project / "scratch-link")
    raw = default_raw()
    (project / "config" / "panels" / "smoke.tsv").write_text((ROOT / "config/panels/smoke.tsv").read_text())
    (project / "config" / "panels" / "motion.tsv").write_text((ROOT / "config/panels/motion.tsv").read_text())
    raw["storage"] = {"scratch": "scratch-link", "work": str(tmp_path / "work")}
    s = study_from_raw(raw, project)
    assert s.scratch == real.resolve()
    assert s.work == (tmp_path / "work").resolve()


def test_a_bad_key_is_one_line_per_error_not_a_schema_dump() -> None:
    raw = default_raw()
    raw["arms"]["fbcache"]["cache"] = {"class": "FirstBlockCacheConfig", "parms": {}}
    with pytest.raises(ConfigError) as e:
        study_from_raw(raw, ROOT)
    lines = str(e.value).splitlines()
    assert len(lines) == 2 and "'arms/fbcache/cache/parms'" in lines[1] and "did you mean 'params'?" in lines[1]


@pytest.mark.parametrize("key, value, words", [
    ("scratch", "/", ["storage/scratch", "file system root"]),
    ("scratch", "/etc/pairflow", ["storage/scratch", "/etc/pairflow", "system directory"]),
    ("work", "/var/lib/x", ["storage/work", "system directory"]),
    ("work", "/usr", ["storage/work", "system directory"]),
    ("scratch", "../outside", ["storage/scratch", "'../outside'", "absolute path"]),
    ("scratch", "workflow/results", ["storage/scratch", "source folders"]),
    ("work", "config", ["storage/work", "source folders"]),
    ("model", "../../x", ["model/path", "'../../x'", "relative path"]),
    ("model", "/proc/self", ["model/path", "system directory"]),
    ("model", "tests/m", ["model/path", "source folders"]),
])
def test_storage_and_model_paths_that_escape_or_hit_system_or_source_dirs_are_refused(key, value, words) -> None:
    raw = default_raw()
    if key == "model":
        raw["model"]["path"] = value
    else:
        raw["storage"][key] = value
    with pytest.raises(ConfigError) as e:
        study_from_raw(raw, ROOT)
    for w in words:
        assert w in str(e.value), str(e.value)


@pytest.mark.parametrize("where, words", [
    ({"scratch": "results/w"}, ["'storage/scratch'", "is the same folder as", "'storage/work'"]),
    ({"scratch": "resources/tiny-wan/scratch"}, ["'storage/scratch'", "lies inside", "'model/path'"]),
    ({"work": "results"}, ["'storage/scratch'", "lies inside", "'storage/work'"]),
    ({"scratch": "."}, ["'storage/scratch'", "the project root itself"]),
    ({"model": "results/scratch/model"}, ["'storage/scratch'", "holds", "'model/path'"]),
    ({"student": "results/scratch/student"}, ["'storage/scratch'", "holds", "'arms/student/model/path'"]),
    ({"student": "resources/tiny-wan/student"}, ["'model/path'", "holds", "'arms/student/model/path'"]),
])
def test_overlapping_storage_and_model_folders_are_refused_naming_both_keys(where, words, tmp_path: Path) -> None:
    """A record placed in a scratch inside the model folder vanished when the model folder
    was swapped in: storage, model and student folders and the project root are disjoint."""
    raw = default_raw()
    raw["storage"] = {"scratch": "results/scratch", "work": "results/w"}
    for key in ("scratch", "work"):
        raw["storage"][key] = where.get(key, raw["storage"][key])
    raw["model"]["path"] = where.get("model", raw["model"]["path"])
    if "student" in where:
        raw["arms"]["student"] = {"model": {"kind": "local", "path": where["student"]}}
    with pytest.raises(ConfigError) as e:
        study_from_raw(raw, ROOT)
    for w in [*words, "disjoint"]:
        assert w in str(e.value), str(e.value)


def test_a_folder_holding_the_project_is_refused_and_one_checkpoint_may_serve_two_arms(tmp_path: Path) -> None:
    raw = default_raw()
    raw["storage"]["work"] = str(ROOT.parent)
    with pytest.raises(ConfigError, match=r"'storage/work'.*a folder holding the project"):
        study_from_raw(raw, ROOT)
    raw = default_raw()
    for name in ("s1", "s2"):
        raw["arms"][name] = {"model": {"kind": "local", "path": str(tmp_path / "student")}}
    assert [a.model.path for a in study_from_raw(raw, ROOT).arms if a.model] == [tmp_path / "student"] * 2


def test_absolute_storage_outside_the_project_is_allowed(tmp_path: Path) -> None:
    raw = default_raw()
    raw["storage"] = {"scratch": str(tmp_path / "s"), "work": str(tmp_path / "w")}
    assert study_from_raw(raw, ROOT).scratch == (tmp_path / "s").resolve()


def test_missing_sheet_message_names_the_panel(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as e:
        read_sheet(tmp_path / "nope.tsv", "motion")
    assert "'panels/motion/sheet'" in str(e.value) and "{panel}" not in str(e.value)


DEFAULT_TEXT = (ROOT / "config" / "config.yaml").read_text()


@pytest.mark.parametrize("edit, key, first, second", [
    # `study` twice: the second silently renamed the study
    (lambda t: t + "study: other\n", "study", "study: tiny-default", "study: other"),
    # an arm defined twice: the first definition was dropped
    (lambda t: t.replace("  fewstep:", "  fbcache:\n    steps: 3\n  fewstep:"), "arms/fbcache",
     "  fbcache:                   # training-free caching", "  fbcache:"),
    # deep inside an arm, in flow style
    (lambda t: t.replace("{threshold: 1.2}", "{threshold: 1.2, threshold: 0.1}"),
     "arms/fbcache/cache/params/threshold", None, None),
    # a panel key inside a flow mapping, and a generation key
    (lambda t: t.replace("seeds: [0, 1]}", "seeds: [0, 1], seeds: [2]}", 1), "panels/smoke/seeds", None, None),
    (lambda t: t.replace("  steps: 6\n", "  steps: 6\n  steps: 60\n"), "generation/steps", "  steps: 6",
     "  steps: 60"),
])
def test_a_key_written_twice_is_refused_with_both_lines_the_key_path_and_the_file(
        tmp_path: Path, edit, key: str, first: str | None, second: str | None) -> None:  # type: ignore[no-untyped-def]
    """YAML keeps the last of two equal keys silently; PairFlow refuses them at any depth."""
    text = edit(DEFAULT_TEXT)
    path = tmp_path / "config" / "config.yaml"
    path.parent.mkdir()
    path.write_text(text)
    assert yaml.safe_load(text)  # a plain loader accepts it: that is the trap
    with pytest.raises(ConfigError) as e:
        load_yaml(path)
    msg = str(e.value)
    assert str(path) in msg and f"key {key!r} is written twice, at lines" in msg, msg
    if first is not None and second is not None:
        lines = text.splitlines()
        a = lines.index(first) + 1
        b = next(i for i, t in enumerate(lines, 1) if t.startswith(second) and i != a)
        assert f"at lines {min(a, b)} and {max(a, b)}" in msg, msg


def test_equal_keys_in_different_mappings_and_yaml_merges_are_not_duplicates(tmp_path: Path) -> None:
    text = ("base: &b {x: 1, y: 2}\nother: {<<: *b, x: 3}\na: {steps: 1}\nb: {steps: 1}\n"
            "list: [{k: 1}, {k: 2}]\n")
    path = tmp_path / "c.yaml"
    path.write_text(text)
    assert load_yaml(path)["other"] == {"x": 3, "y": 2}
    path.write_text("1: a\n1.0: b\n")  # equal as Python keys, as YAML keeps them
    with pytest.raises(ConfigError, match=r"key '1.0' is written twice, at lines 1 and 2"):
        load_yaml(path)


def test_a_config_that_is_not_utf8_text_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_bytes(b"study: a\nmodel:\n  path: caf\xe9\n")
    with pytest.raises(ConfigError, match=rf"{path}:3: byte 12 \(0xe9\) is not valid UTF-8"):
        load_yaml(path)
    path.write_bytes(b"study: a\x00\n")
    with pytest.raises(ConfigError, match=rf"{path}:1: byte 9 is a NUL byte"):
        load_yaml(path)


def test_the_missing_config_message_names_no_flag(tmp_path: Path) -> None:
    """Every command names the config its own way (check-config takes it positionally),
    so the library's message names the path, not a flag."""
    with pytest.raises(ConfigError) as e:
        load_yaml(tmp_path / "nope.yaml")
    assert f"config file {tmp_path / 'nope.yaml'} does not exist" in str(e.value) and "--" not in str(e.value)


TEN_MB = 10 * 1000 * 1000

HOSTILE_SHEETS = {
    # name: (bytes, line, words in the message)
    "ten-megabyte prompt": (b"prompt_id\tprompt\na\tfine\nbig\t" + b"x" * TEN_MB + b"\n", 3,
                            ["prompt 'big' is 10000000 bytes", "8192-byte limit", "shorten it"]),
    "invalid UTF-8": (b"prompt_id\tprompt\na\tfine\nb\tcaf\xe9 au lait\n", 3,
                      ["byte 6 (0xe9) is not valid UTF-8", "iconv"]),
    "NUL byte": (b"prompt_id\tprompt\na\tfi\x00ne\n", 2, ["byte 5 is a NUL byte", "binary file"]),
    "binary file": (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00", 3, ["NUL byte", "binary file"]),
    "gzip file": (b"\x1f\x8b\x08\x00\x00\x00\x00\x00", 1, ["NUL byte", "'panels/p/sheet'"]),
    "UTF-16 text": ("prompt_id\tprompt\na\tx\n".encode("utf-16"), 1, ["UTF-16", "save it as UTF-8"]),
    "byte-order mark": (b"\xef\xbb\xbfprompt_id\tprompt\na\tx\n", 1, ["byte-order mark", "without one"]),
    "missing header": (b"a\ta red fox\nb\twaves\n", 1, ["header 'prompt_id<TAB>prompt'", "'a\\ta red fox'",
                                                       "add that header line"]),
    "empty file": (b"", 1, ["header", "an empty file"]),
    "three fields": (b"prompt_id\tprompt\na\tx\nb\ta fox\tin snow\n", 3,
                     ["expected 2 tab-separated fields", "got 3", "may not hold a tab"]),
    "one field": (b"prompt_id\tprompt\na\tx\njust text\n", 3, ["expected 2 tab-separated fields", "got 1"]),
    "huge one-field line": (b"prompt_id\tprompt\n" + b"y" * TEN_MB + b"\n", 2, ["got 1"]),
    "huge prompt id": (b"prompt_id\tprompt\n" + b"i" * TEN_MB + b"\tx\n", 2, ["is not allowed", "characters)"]),
    "control character": (b"prompt_id\tprompt\na\tred\x1b[31m fox\n", 2, ["U+001B", "remove it"]),
    "carriage return inside": (b"prompt_id\tprompt\na\tred\rfox\n", 2, ["U+000D"]),
    "no prompts": (b"prompt_id\tprompt\n\n", 0, ["no prompts", "add at least one row"]),
}


@pytest.mark.parametrize("name", sorted(HOSTILE_SHEETS))
def test_an_unreadable_sheet_is_refused_with_its_path_line_and_fix(tmp_path: Path, name: str) -> None:
    data, line, words = HOSTILE_SHEETS[name]
    sheet = tmp_path / "s.tsv"
    sheet.write_bytes(data)
    with pytest.raises(ConfigError) as e:
        read_sheet(sheet, "p")
    msg = str(e.value)
    assert str(sheet) + (f":{line}:" if line else ":") in msg, msg
    for w in words:
        assert w in msg, msg
    assert len(msg) < 400, len(msg)  # a 10 MB cell is never echoed


def test_sheets_that_are_not_files_or_too_big_are_refused_before_reading(tmp_path: Path) -> None:
    from pairflow.plan.config import MAX_SHEET_BYTES

    with pytest.raises(ConfigError, match=r"is not a regular file.*'panels/p/sheet'"):
        read_sheet(tmp_path, "p")
    big = tmp_path / "big.tsv"
    with big.open("wb") as f:  # sparse: the size is what is checked, nothing is read
        f.truncate(MAX_SHEET_BYTES + 1)
    with pytest.raises(ConfigError, match=rf"{big} is {MAX_SHEET_BYTES + 1} bytes, over the {MAX_SHEET_BYTES}-byte"):
        read_sheet(big, "p")


def test_crlf_sheets_and_prompts_at_the_limit_read_as_written(tmp_path: Path) -> None:
    from pairflow.plan.config import MAX_PROMPT_BYTES

    sheet = tmp_path / "s.tsv"
    long = "\u00e9" * (MAX_PROMPT_BYTES // 2)  # two bytes each: exactly at the limit
    sheet.write_bytes(f"prompt_id\tprompt\r\na\ta red fox\r\n\r\nb\t{long}\r\n".encode())
    a, b = read_sheet(sheet, "p")
    assert (a.prompt_id, a.text) == ("a", "a red fox") and b.text == long


def test_relative_paths_resolve_against_the_given_root_never_the_configs_folder(tmp_path: Path) -> None:
    """One rule for every entry point: relative paths are the working directory's
    (the project's), wherever the config file is kept."""
    project = tmp_path / "proj"
    (project / "config" / "panels").mkdir(parents=True)
    (project / "studies").mkdir()
    for sheet in ("smoke.tsv", "motion.tsv"):
        (project / "config" / "panels" / sheet).write_text((ROOT / "config" / "panels" / sheet).read_text())
    path = project / "studies" / "a.yaml"
    path.write_text(DEFAULT_TEXT)
    s = load_study(path, project)
    assert s.root == project.resolve() and s.scratch == (project / "results" / "scratch").resolve()
    assert s.panels[0].sheet == (project / "config" / "panels" / "smoke.tsv").resolve()
    with pytest.raises(ConfigError, match="resolve against the directory Snakemake runs in"):
        load_study(path)  # outside config/: its own folder is not the project, so no guess
    inside = project / "config" / "b.yaml"
    inside.write_text(DEFAULT_TEXT)
    assert load_study(inside).root == project.resolve()


def _documented_keys(page: str) -> list[str]:
    """The keys a docs page's key table names: the backticked names of each row's first
    cell (``generation.height``, ``.width``: the second inherits the first's parent)."""
    out: list[str] = []
    for line in (ROOT / "docs" / page).read_text().splitlines():
        if not line.startswith("| `"):
            continue
        parent = ""
        for name in re.findall(r"`([^`]+)`", line.split("|")[1]):
            if "/" in name:
                continue  # the module that declares it (`kinds/cache.py`)
            name = parent + name if name.startswith(".") else name
            parent = name.rsplit(".", 1)[0] if "." in name else ""
            out.append(name)
    return out


def test_every_config_key_has_its_row_in_the_docs_and_no_row_is_stale() -> None:
    """docs/configuration.md (and docs/arms.md for an arm's keys) has a row for every key
    the config schema takes, and none for a key it does not."""
    schema = config._schema()["properties"]
    keys = set()
    for top, spec in schema.items():
        keys.add(top)
        keys |= {f"{top}.{k}" for k in spec.get("properties", {})}
        more = spec.get("additionalProperties")
        if isinstance(more, dict):
            keys |= {f"{top}.<name>.{k}" for k in more.get("properties", {})}
    documented = set(_documented_keys("configuration.md")) | set(_documented_keys("arms.md"))
    # a section (``storage``) is documented by its keys' rows; a key by its own row
    missing = sorted(k for k in keys if k not in documented and not any(d.startswith(f"{k}.") for d in documented))
    assert missing == [], f"add a row to docs/configuration.md (an arm's key: docs/arms.md) for {missing}"
    stale = sorted(documented - keys)
    assert stale == [], f"docs/configuration.md or docs/arms.md names keys the schema does not take: {stale}"


def test_the_readme_wan21_single_gpu_config_is_valid(tmp_path: Path, tiny_model: Path) -> None:
    """config/examples/wan21-1gpu.yaml (docs/your-own-study.md, "Pointing the config at a real checkpoint")
    passes every check a run makes, with its model path and prompt sheet supplied."""
    raw = yaml.safe_load((ROOT / "config" / "examples" / "wan21-1gpu.yaml").read_text())
    raw["model"]["path"] = str(tiny_model)  # the download itself is not in the test
    sheet = tmp_path / "config" / "panels" / "mine.tsv"
    sheet.parent.mkdir(parents=True)
    sheet.write_text("prompt_id\tprompt\ncat\ta cat walking on grass, realistic\n")
    study = study_from_raw(raw, tmp_path)
    assert [a.name for a in study.arms] == ["control", "fbc005", "fbc010"]
    assert (study.generation.frames, study.generation.height, study.generation.width) == (81, 480, 832)


def test_the_arm_specs_live_below_the_arms_and_config_re_exports_them() -> None:
    """``pairflow.specs`` (what an arm is made of) loads without ``pairflow.arms`` or
    ``pairflow.plan.config``, so the arm kinds can build on it while config builds on them;
    ``config`` hands out the very same classes."""
    code = ("import sys; import pairflow.specs; "
            "print(sorted(m for m in sys.modules if m.startswith(('pairflow.arms', 'pairflow.plan.config'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    assert (config.ArmSpec, config.ModelSpec, config.GenerationSpec, config.SearchSpec) == (
        specs.ArmSpec, specs.ModelSpec, specs.GenerationSpec, specs.SearchSpec)
