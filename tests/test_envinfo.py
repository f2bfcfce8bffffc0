"""envinfo: the environment record, read from package metadata."""

from __future__ import annotations

import subprocess
import sys


def test_environment_record_does_not_import_torch() -> None:
    """The driver writes the environment into every record without paying torch's import."""
    code = ("import sys; from pairflow.envinfo import environment, torch_cuda_version; e = environment(); "
            "v = torch_cuda_version(); "
            "assert 'torch' not in sys.modules, 'torch imported'; "
            "assert e['packages']['torch'] and 'cuda' in e and 'driver' in e; print(v)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    import torch

    assert out.stdout.strip() == str(torch.version.cuda)  # the same value torch reports once imported
