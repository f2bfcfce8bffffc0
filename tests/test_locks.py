from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pairflow.errors import LockError
from pairflow.locks import hold


def test_second_writer_gets_a_clear_message(tmp_path: Path) -> None:
    # The holder is another process, as with two snakemake runs on one results directory.
    code = (f"import time, sys; from pairflow.locks import hold\n"
            f"with hold({str(tmp_path)!r}, 'first'):\n    print('held', flush=True); time.sleep(30)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        with pytest.raises(LockError, match=r"generate t: .* is being written by another run \(host .* pid \d+\)"):
            with hold(tmp_path, "generate t"):
                pass
    finally:
        proc.kill()
        proc.wait()
    with hold(tmp_path, "after the holder was killed"):  # no stale lock after SIGKILL
        pass
