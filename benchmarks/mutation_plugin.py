"""pytest plugin of ``benchmarks/mutation.py`` (loaded with ``-p mutation_plugin``).

* Before every test, the analysis modules' ``functools`` caches are cleared, so a test's
  outcome never rests on a result an earlier test cached: a test that reads a line's
  result then runs that line itself. That is what makes "the tests that reach a line"
  (below) the only tests that can see a mutant of it.
* With ``PAIRFLOW_MUTATION_COVERAGE=<data file>``, coverage.py measures
  ``pairflow/analysis`` with one context per test (its node id; lines run at import, under
  collection, have the empty context). coverage.py's own ``dynamic_context =
  test_function`` names a test by function, not by node id (a parametrised case would
  run every case), hence this switch.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import pytest

_cov: Any = None
_order: list[str] = []


def _clear_caches() -> None:
    for name, module in list(sys.modules.items()):
        if name.startswith("pairflow.analysis"):
            for obj in list(vars(module).values()):
                clear = getattr(obj, "cache_clear", None)
                if callable(clear):
                    clear()


def pytest_configure(config: pytest.Config) -> None:
    global _cov
    data = os.environ.get("PAIRFLOW_MUTATION_COVERAGE")
    if data:
        import coverage

        import pairflow

        source = os.path.join(os.path.dirname(pairflow.__file__), "analysis")
        _cov = coverage.Coverage(data_file=data, source=[source], config_file=False)
        _cov.start()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    _clear_caches()
    if _cov is not None:
        _cov.switch_context(item.nodeid)
        _order.append(item.nodeid)


def pytest_unconfigure(config: pytest.Config) -> None:
    """Save the data, and beside it ``<data file>.json``: per measured file, per line, the
    contexts that ran it, and the tests in the order they ran (read by ``mutation.py``
    under a Python without coverage.py)."""
    if _cov is None:
        return
    _cov.stop()
    _cov.save()
    data = _cov.get_data()
    lines = {f: {str(k): sorted(v) for k, v in data.contexts_by_lineno(f).items()} for f in data.measured_files()}
    with open(os.environ["PAIRFLOW_MUTATION_COVERAGE"] + ".json", "w", encoding="utf-8") as fh:
        json.dump({"lines": lines, "order": _order}, fh)
