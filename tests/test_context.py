"""context: a task carries its candidate and a reference, never the study."""

from __future__ import annotations

import copy
import pickle
from pathlib import Path

import dill
import pytest
from conftest import small_config

from pairflow.errors import IntegrityError
from pairflow.plan import context
from pairflow.plan.candidates import candidates, task_identity
from pairflow.plan.config import study_from_raw
from pairflow.plan.context import ContextRef, load_context, write_context


def _study(tmp: Path, prompts: int):  # type: ignore[no-untyped-def]
    cfg = small_config(tmp, tmp / "model")
    sheet = Path(cfg["panels"]["t"]["sheet"])
    sheet.write_text("prompt_id\tprompt\n" + "".join(f"q{i}\ta prompt about thing {i}\n" for i in range(prompts)))
    return study_from_raw(copy.deepcopy(cfg), tmp, source="test")


def test_task_payload_does_not_grow_with_the_study(tmp_path: Path) -> None:
    sizes = []
    for n in (10, 2000):
        study = _study(tmp_path / str(n), n)
        ref = write_context(study.scratch, {"study": study})
        c = candidates(study, study.panels[0])[-1]
        sizes.append(len(dill.dumps({"context": ref, "candidate": c, "identity": task_identity(c)})))
        assert len(dill.dumps({"study": study})) > 20 * sizes[-1] or n == 10
    assert abs(sizes[1] - sizes[0]) <= 16 and sizes[1] < 2048  # flat: only the prompt id's digits differ


def test_context_is_named_by_its_digest_read_once_and_checked(tmp_path: Path) -> None:
    ref = write_context(tmp_path, {"x": list(range(100))})
    assert Path(ref.path).name == ref.digest.split(":", 1)[1] + ".pkl" and ref.digest.startswith("xxh3_128:")
    assert write_context(tmp_path, {"x": list(range(100))}) == ref  # identical context: same file
    context._LOADED.clear()  # a fresh worker
    assert load_context(ref) == {"x": list(range(100))}
    Path(ref.path).write_bytes(pickle.dumps({"x": "other"}))
    assert load_context(ref) == {"x": list(range(100))}  # read once per process
    context._LOADED.clear()
    with pytest.raises(IntegrityError, match="replaced it"):
        load_context(ref)
    with pytest.raises(IntegrityError, match="missing"):
        load_context(ContextRef(str(tmp_path / "gone.pkl"), ref.digest + "0"))
