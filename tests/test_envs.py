"""envs/: the lock (requirements.lock, the exact versions setup installs) is compiled from
today's pyproject and is what is installed; the one conda environment every rule uses is
valid, pinned as the lock pins within pyproject's ranges, complete, current, and the one
every rule names. No network: the lock is read, never recompiled."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version

import tomllib
import yaml
from conftest import ROOT
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

ENV = ROOT / "envs" / "pairflow.yaml"
LOCK = ROOT / "envs" / "requirements.lock"
REGENERATE = ".venv/bin/python workflow/checks/lock.py"


def _lock_module():
    spec = importlib.util.spec_from_file_location("lock", ROOT / "workflow" / "checks" / "lock.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _locked() -> dict[str, str]:
    return {canonicalize_name(n): v for n, v in _lock_module().pins(LOCK.read_text()).items()}


def test_the_lock_pins_every_pyproject_requirement_within_its_range() -> None:
    """Every runtime dependency and test-extra requirement has an exact pin in the lock
    that satisfies pyproject's specifier; torch and torchvision are this workplace's."""
    lock = _locked()
    reqs = _lock_module().pyproject_requirements()
    assert LOCK.read_text().count("\n-e ") == 0  # constraints cannot name the project itself
    for line in reqs["dependencies"] + reqs["test"]:
        req = Requirement(line)
        pin = lock.get(canonicalize_name(req.name))
        if pin is None and req.marker is not None and not req.marker.evaluate():
            continue
        assert pin is not None, f"{req.name} is not in {LOCK.name}; regenerate it: {REGENERATE}"
        assert req.specifier.contains(pin, prereleases=True), (
            f"{LOCK.name} pins {req.name}=={pin} outside pyproject's {req.specifier}; regenerate it: {REGENERATE}")
    assert lock["torch"] == "2.14.1" and lock["torchvision"] == "0.29.1"


def test_the_lock_was_compiled_from_todays_pyproject_requirements() -> None:
    """The lock's header records the digest of the requirement lists it was compiled from
    (and the command that regenerates it); a changed dependency or test extra means a new lock."""
    lock = _lock_module()
    text = LOCK.read_text()
    assert f"#     .venv/bin/pip install pip-tools==7.7.0 && {REGENERATE}\n" in text
    assert f"#    {REGENERATE}\n" in text  # pip-compile's own header names the same command
    recorded = lock.recorded_digest(text)
    assert recorded is not None, f"{LOCK.name} records no pyproject digest; regenerate it: {REGENERATE}"
    assert recorded == lock.requirements_digest(), (
        f"pyproject.toml's dependencies or test extra changed since {LOCK.name} was compiled; "
        f"regenerate it: {REGENERATE}")
    edited = lock.pyproject_requirements()
    edited["dependencies"][0] += ",!=2.5.0"
    assert lock.requirements_digest(edited) != recorded
    res = subprocess.run([sys.executable, str(ROOT / "workflow" / "checks" / "lock.py"), "--check"],
                         capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stderr


def test_the_installed_environment_is_the_lock() -> None:
    """Every package the lock names is installed at the lock's version (what
    `pip install -c envs/requirements.lock` accepts: a local label such as +cu130 aside)."""
    wrong = []
    for name, pin in sorted(_locked().items()):
        try:
            have = version(name)
        except PackageNotFoundError:
            have = None
        if have is None or not SpecifierSet(f"=={pin}").contains(have, prereleases=True):
            wrong.append(f"{name}: lock {pin}, installed {have}")
    assert not wrong, (f"this environment ({sys.prefix}) is not {LOCK.name}: " + "; ".join(wrong)
                       + ". Run `bash workflow/setup.sh test` again; or, if the lock is what should change, "
                       f"regenerate it deliberately ({REGENERATE}) and then run setup.")


def test_setup_installs_every_package_with_the_lock_as_constraints() -> None:
    installs = [line for line in (ROOT / "workflow" / "setup.sh").read_text().splitlines()
                if re.match(r"\.venv/bin/pip install", line) and "--upgrade pip" not in line]
    assert len(installs) == 2, installs  # torch and torchvision, then the project (with its extra)
    for line in installs:
        assert '-c "$lock"' in line, line
    assert 'lock=envs/requirements.lock' in (ROOT / "workflow" / "setup.sh").read_text()


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


def test_env_is_generated_from_pyproject_and_the_lock_and_is_current() -> None:
    res = subprocess.run([sys.executable, str(ROOT / "workflow" / "checks" / "conda_env.py"), "--check"],
                         capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stderr


def test_every_rule_with_software_names_the_one_env() -> None:
    named = []
    for smk in sorted((ROOT / "workflow" / "rules").glob("*.smk")):
        named += re.findall(r"conda:\s*\n\s*\"([^\"]+)\"", smk.read_text())
    assert named and set(named) == {"../../envs/pairflow.yaml"}
    assert sorted(p.name for p in (ROOT / "envs").iterdir()) == ["pairflow.yaml", "requirements.lock"]
