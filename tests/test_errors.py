"""errors: every exception class the package raises by name is a PairFlowError subclass
(docs/layout.md's promise), except the few listed below, each with why; and the tree drawn
in the module docstring names every class the module defines."""

from __future__ import annotations

import ast
import builtins
import importlib
import re
from pathlib import Path

import pytest

from pairflow import errors
from pairflow.errors import PairFlowError

PACKAGE = Path(errors.__file__).parent

NOT_PAIRFLOW = {
    # argparse's own way of refusing a command-line value: argparse turns it into a usage message.
    ("cli", "ArgumentTypeError"),
    # unreachable: argparse lets only known commands through.
    ("cli", "AssertionError"),
    # a caller's misuse of an internal API (no user input reaches it).
    ("generation.compute", "ValueError"),
    # the SPS parser's signal for "does not parse", caught in the same module.
    ("media.h264", "ValueError"),
    # zlib.error for a block that does not end where the index says: caught at once and
    # raised again as IntegrityError, as zlib's own errors are.
    ("records.packs", "error"),
    # process control, not errors: Ctrl-C forwarded, and the module's command-line usage.
    ("fleet.orphans", "KeyboardInterrupt"),
    ("fleet.orphans", "SystemExit"),
    ("fleet.pool", "SystemExit"),
    # a module's __getattr__ must raise AttributeError for a name it does not have (PEP 562):
    # the deferred torch._dynamo's dunder lookups.
    ("arms.dynamo", "AttributeError"),
    ("stages.calibworker", "SystemExit"),  # the fresh calibration worker's exit status (python -m pairflow.stages.calibworker)
}


def raised_classes() -> list[tuple[str, str, type[BaseException]]]:
    """(module, name, class) of every ``raise Name(...)`` / ``raise mod.Name(...)`` in the
    package whose name resolves, in its module, to an exception class."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module_name = ".".join(("pairflow", *path.relative_to(PACKAGE).with_suffix("").parts)).removesuffix(
            ".__init__")
        module = importlib.import_module(module_name)
        short = module_name.removeprefix("pairflow.")
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Raise) or node.exc is None:
                continue
            target = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if isinstance(target, ast.Name):
                obj = getattr(module, target.id, getattr(builtins, target.id, None))
                name = target.id
            elif isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name):
                owner = getattr(module, target.value.id, None)
                obj, name = getattr(owner, target.attr, None), target.attr
            else:
                continue
            if isinstance(obj, type) and issubclass(obj, BaseException):
                found.append((short, name, obj))
    return found


def test_every_error_the_package_raises_is_a_pairflow_error() -> None:
    found = raised_classes()
    assert len(found) > 100  # the walk sees the package's raises (about 300)
    stray = sorted({(m, n) for m, n, cls in found if not issubclass(cls, PairFlowError)} - NOT_PAIRFLOW)
    assert stray == [], f"raise a PairFlowError subclass (pairflow/errors.py) instead: {stray}"
    still = {(m, n) for m, n, cls in found if not issubclass(cls, PairFlowError)}
    assert NOT_PAIRFLOW <= still, f"no longer raised, drop from the list: {NOT_PAIRFLOW - still}"


def test_the_docstring_tree_names_every_error_class() -> None:
    defined = {name for name, obj in vars(errors).items()
               if isinstance(obj, type) and issubclass(obj, PairFlowError)}
    drawn = set(re.findall(r"[├└]── (\w+)", errors.__doc__ or ""))
    assert defined - {"PairFlowError"} == drawn


def test_a_component_of_the_wrong_class_is_a_model_build_error() -> None:
    """Issue 24: tinymodel raised a bare TypeError here."""
    from pairflow.errors import ModelBuildError
    from pairflow.generation.tinymodel import _checked

    assert _checked(3, int) == 3
    with pytest.raises(ModelBuildError, match="diffusers gave a str where a int was expected.*rebuild the model"):
        _checked("a transformer", int)
