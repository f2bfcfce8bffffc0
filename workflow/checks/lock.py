"""Write (or check) envs/requirements.lock, the exact versions `workflow/setup.sh` installs.

pip-tools' ``pip-compile`` resolves pyproject.toml's dependencies and its ``test`` extra to
one version of every package; setup.sh installs with the lock as constraints
(``pip install -c envs/requirements.lock ...``), so a fresh machine gets these versions and
not whatever was newest that day. The lock's header records a digest of the pyproject
requirement lists it was compiled from; tests/test_envs.py compares it with today's.

Regenerate deliberately (needs PyPI; after changing pyproject's dependencies or test
extra, or to take newer releases), then rerun setup and conda_env.py:

    .venv/bin/pip install pip-tools==7.7.0
    .venv/bin/python workflow/checks/lock.py                     # keep the lock's pins where they still fit
    .venv/bin/python workflow/checks/lock.py --upgrade           # newest versions pyproject allows
    .venv/bin/python workflow/checks/lock.py -P transformers     # newest of one package
    .venv/bin/python workflow/checks/lock.py --prefer-installed  # pins = this venv's versions where they fit
    .venv/bin/python workflow/checks/lock.py --check             # exit 1 when pyproject changed since

Without ``--upgrade``/``-P`` pip-compile keeps every pin of the existing lock that still
satisfies pyproject (its standard behaviour), so a regeneration changes only what must.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "envs" / "requirements.lock"
COMMAND = ".venv/bin/python workflow/checks/lock.py"
DIGEST = re.compile(r"^# pyproject-requirements: (sha256:[0-9a-f]{64})$", re.M)
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", re.M)


def pyproject_requirements(pyproject: Path = ROOT / "pyproject.toml") -> dict[str, list[str]]:
    """The requirement lists the lock is compiled from: runtime dependencies and the test extra."""
    project = tomllib.loads(pyproject.read_text())["project"]
    return {"dependencies": list(project["dependencies"]), "test": list(project["optional-dependencies"]["test"])}


def requirements_digest(reqs: dict[str, list[str]] | None = None) -> str:
    """sha256 of the requirement lists, as canonical JSON (file order kept: a reordering counts)."""
    blob = json.dumps(reqs if reqs is not None else pyproject_requirements(), sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(blob.encode()).hexdigest()


def recorded_digest(text: str) -> str | None:
    m = DIGEST.search(text)
    return m.group(1) if m else None


def pins(text: str) -> dict[str, str]:
    """The lock's ``name==version`` lines, by name as written."""
    return dict(PIN.findall(text))


def header(digest: str) -> str:
    return "\n".join([
        "# envs/requirements.lock: the exact versions workflow/setup.sh installs (as pip constraints,",
        "# `pip install -c envs/requirements.lock`), compiled by pip-tools' pip-compile from",
        "# pyproject.toml's dependencies and its `test` extra. Do not edit by hand; regenerate with",
        f"#     .venv/bin/pip install pip-tools==7.7.0 && {COMMAND}",
        "# (add --upgrade for the newest versions pyproject allows), then rerun `bash workflow/setup.sh test`",
        "# and `.venv/bin/python workflow/checks/conda_env.py`.",
        f"# pyproject-requirements: {digest}",
    ]) + "\n"


def compile_lock(prefer_installed: bool, passthrough: list[str]) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "requirements.lock"
        if prefer_installed:  # pip-compile takes an existing output file's pins as preferences
            freeze = subprocess.run([sys.executable, "-m", "pip", "freeze", "--all", "--exclude-editable"],
                                    capture_output=True, text=True, check=True).stdout
            out.write_text(freeze)
        elif LOCK.exists():
            out.write_text(LOCK.read_text())
        cmd = [sys.executable, "-m", "piptools", "compile", "--quiet", "--allow-unsafe", "--strip-extras",
               "--extra", "test", "--no-emit-index-url", "--no-emit-find-links", "--no-emit-trusted-host",
               "--output-file", str(out), *passthrough, "pyproject.toml"]
        # pip-compile names CUSTOM_COMPILE_COMMAND in its header instead of its own command line
        subprocess.run(cmd, cwd=ROOT, check=True, env={**os.environ, "CUSTOM_COMPILE_COMMAND": COMMAND})
        return out.read_text()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when pyproject's requirements changed since the lock was compiled (no network)")
    parser.add_argument("--prefer-installed", action="store_true",
                        help="prefer this venv's installed versions over the existing lock's pins")
    args, passthrough = parser.parse_known_args(argv)  # the rest (--upgrade, -P NAME) goes to pip-compile
    digest = requirements_digest()
    if args.check:
        if not LOCK.exists() or recorded_digest(LOCK.read_text()) != digest:
            print(f"{LOCK} was compiled from other pyproject requirements than today's; regenerate it: {COMMAND}",
                  file=sys.stderr)
            return 1
        return 0
    body = compile_lock(args.prefer_installed, passthrough)
    LOCK.write_text(header(digest) + body)
    print(f"wrote {LOCK} ({len(pins(body))} pins)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
