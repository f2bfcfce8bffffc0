from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from pairflow.config import load_study, load_yaml, read_sheet, study_from_raw
from pairflow.errors import ConfigError

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
    (lambda c: c["stats"].update(target_effects={"lpips": 0.01}), ["target_effects", "lpips", "scorers"]),
    (lambda c: c["stats"].update(target_effects={"ssim": 0}), ["target_effects", "ssim"]),
    (lambda c: c.update(scoring={"decode": "bt2020"}), ["decode", "bt2020"]),
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
