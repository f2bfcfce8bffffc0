"""envs/: the one conda environment every rule uses is valid, pinned within pyproject's
ranges, complete, current, and the one every rule names."""

from __future__ import annotations

import re
import subprocess
import sys

import tomllib
import yaml
from conftest import ROOT
from packaging.requirements import Requirement

ENV = ROOT / "envs" / "pairflow.yaml"


def _pip_lines() -> list[str]:
    deps = yaml.safe_load(ENV.read_text())["dependencies"]
    return next(d["pip"] for d in deps if isinstance(d, dict))


def test_every_pip_line_is_a_pin_within_pyproject_or_the_project_itself() -> None:
    wanted = {Requirement(r).name: Requirement(r) for r in
              tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]}
    pinned = {}
    for line in _pip_lines():
        if line == "-e ${PAIRFLOW_HOME}":
            continue
        assert not line.startswith("-"), f"{line!r}: no pip options besides the project's own editable install"
        req = Requirement(line)  # raises on anything pip would reject
        (spec,) = req.specifier
        assert spec.operator == "==", f"{line!r} is not pinned"
        assert wanted[req.name].specifier.contains(spec.version, prereleases=True), (line, str(wanted[req.name]))
        pinned[req.name] = spec.version
    assert set(pinned) == set(wanted), set(wanted) ^ set(pinned)
    assert "-e ${PAIRFLOW_HOME}" in _pip_lines()


def test_env_is_generated_from_pyproject_and_is_current() -> None:
    res = subprocess.run([sys.executable, str(ROOT / "workflow" / "checks" / "conda_env.py"), "--check"],
                         capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stderr


def test_every_rule_with_software_names_the_one_env() -> None:
    named = []
    for smk in sorted((ROOT / "workflow" / "rules").glob("*.smk")):
        named += re.findall(r"conda:\s*\n\s*\"([^\"]+)\"", smk.read_text())
    assert named and set(named) == {"../../envs/pairflow.yaml"}
    assert sorted(p.name for p in (ROOT / "envs").iterdir()) == ["pairflow.yaml"]
