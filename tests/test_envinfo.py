"""envinfo: the environment record, read from package metadata."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def test_environment_record_does_not_import_torch() -> None:
    """The driver writes the environment into every record without paying torch's import."""
    code = ("import sys; from pairflow.envinfo import environment, torch_cuda_version; e = environment(); "
            "v = torch_cuda_version(); "
            "assert 'torch' not in sys.modules, 'torch imported'; "
            "assert e['packages']['torch'] and 'cuda' in e and 'driver' in e; print(v)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    import torch

    assert out.stdout.strip() == str(torch.version.cuda)  # the same value torch reports once imported


def test_installed_digest_counts_each_distribution_once_however_often_the_path_lists_it(tmp_path) -> None:
    """A Snakemake job sees the project's ``workflow/`` (and its egg-info) on its path more
    often than the planner does; the digest, which keys the calibration table, must not
    change with that, and must change when what is installed changes."""
    site = tmp_path / "site"
    meta = site / "pf_demo_dist-1.0.dist-info"
    meta.mkdir(parents=True)
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: pf-demo-dist\nVersion: 1.0\n")
    code = "from pairflow.envinfo import environment; print(environment()['installed_digest'])"

    def digest(*entries: str, cwd: Path = tmp_path) -> str:
        # ``python -c`` puts its working directory first on the path, besides PYTHONPATH's
        # entries (which Python itself deduplicates): run from ``site`` to list it twice.
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([*entries, os.environ.get("PYTHONPATH", "")])}
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                              env=env, cwd=cwd).stdout.strip()

    once, twice = digest(str(site)), digest(str(site), cwd=site)
    assert once == twice
    assert once != digest()  # the extra distribution is seen


def test_the_installed_digest_ignores_a_packages_vendored_folder() -> None:
    """Importing ``pkg_resources`` (CLIP does) puts ``setuptools/_vendor`` on the path;
    the digest of what is installed stays what it was before (it keys the calibration
    table and is compared across processes by the claim card)."""
    code = ("from pairflow import envinfo; before = envinfo.environment()['installed_digest']; "
            "import sys, pkg_resources; "
            "assert any(p.endswith('_vendor') for p in sys.path), 'pkg_resources added no vendored folder'; "
            "envinfo.environment.cache_clear(); "
            "assert envinfo.environment()['installed_digest'] == before, 'digest changed'")
    subprocess.run([sys.executable, "-W", "ignore", "-c", code], check=True, capture_output=True, text=True)
