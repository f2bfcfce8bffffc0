"""Defer ``torch._dynamo`` until something compiles (``defer_dynamo``).

diffusers, transformers, torchvision and bitsandbytes import ``torch._dynamo`` when they
are imported (about 1.1 s of CPU, 900 modules, on this machine), though no arm of a
default study compiles: ``diffusers.utils.torch_utils`` takes ``allow_in_graph``,
``transformers.masking_utils`` a submodule, ``transformers``' modules decorate with
``torch.compiler.disable`` / ``allow_in_graph`` and ``torch._dynamo.assume_constant_result``,
torchvision's ``roi_align`` takes ``torch._dynamo.utils``, bitsandbytes wraps CPU kernels
in ``torch.compile`` (compiled on first call), and a pipeline's ``register_modules`` asks
``isinstance(m, torch._dynamo.eval_frame.OptimizedModule)``.

Under the guard, ``import torch._dynamo`` makes the package's module without running its
``__init__`` (its submodules still import, one by one), and answers those import-time
uses without dynamo, each as dynamo would while nothing compiles:

- ``allow_in_graph(fn)``: returns ``fn`` and registers it with dynamo when dynamo loads;
- ``disable(fn)``: ``fn`` until dynamo loads, dynamo's disabled ``fn`` after;
- ``assume_constant_result(fn)``: marks ``fn`` exactly as dynamo does;
- ``optimize(...)(fn)`` (``torch.compile`` of a function): compiled on its first call,
  as ``torch.compile`` compiles anyway; a module is compiled at once;
- ``eval_frame.OptimizedModule``: a class nothing is an instance of (no module was
  compiled, as dynamo is not loaded).

Any other attribute of ``torch._dynamo`` (``torch.compile`` of a module, a compiling arm's
first call, ``torch._dynamo.config``...) runs the real ``__init__`` then and there
("materialises" dynamo) and everything above hands over to dynamo. Nothing in
third-party files is changed. ``materialised()`` says whether dynamo was loaded.
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import threading
import types
from collections.abc import Callable
from typing import Any

NAME = "torch._dynamo"
SHIMS = ("_pairflow_deferred", "__getattr__", "allow_in_graph", "disable", "assume_constant_result", "optimize",
         "eval_frame")
_LOCK = threading.RLock()


class _NotCompiled:
    """Stands for ``eval_frame.OptimizedModule`` while dynamo is deferred: no instance exists."""


class _Deferring(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """The finder ``defer_dynamo`` puts first on ``sys.meta_path``."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name != NAME:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        self.real = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        _shim(module, self.real)


def _shim(module: types.ModuleType, real: Any) -> None:
    d = module.__dict__
    pending: list[Any] = []

    def deferred() -> bool:
        return d.get("__getattr__") is __getattr__

    def materialise() -> None:
        with _LOCK:
            if not deferred():
                return
            for k in SHIMS:
                d.pop(k, None)
            module.__loader__ = real
            if module.__spec__ is not None:
                module.__spec__.loader = real
            real.exec_module(module)
            for fn in pending:
                module.allow_in_graph(fn)
            pending.clear()

    def __getattr__(name: str) -> Any:  # PEP 562: the module's attribute hook
        if name.startswith("__"):
            raise AttributeError(name)
        # `from torch._dynamo import callback`, `from . import config`: that submodule only
        if _caller().startswith("importlib") and importlib.util.find_spec(f"{NAME}.{name}") is not None:
            return importlib.import_module(f"{NAME}.{name}")
        materialise()
        return getattr(module, name)

    def allow_in_graph(fn: Any) -> Any:
        with _LOCK:
            if deferred():
                pending.append(fn)
                return fn
        return module.allow_in_graph(fn)

    def disable(fn: Any = None, recursive: bool = True, **kwargs: Any) -> Any:
        if fn is None:
            return functools.partial(disable, recursive=recursive, **kwargs)
        if not deferred():
            return module.disable(fn, recursive, **kwargs)
        real_fn: list[Any] = []

        @functools.wraps(fn)
        def lazily_disabled(*a: Any, **k: Any) -> Any:
            if deferred():
                return fn(*a, **k)
            if not real_fn:
                real_fn.append(module.disable(fn, recursive, **kwargs))
            return real_fn[0](*a, **k)

        return lazily_disabled

    def assume_constant_result(fn: Any) -> Any:
        fn._dynamo_marked_constant = True
        return fn

    def optimize(*args: Any, **kwargs: Any) -> Callable[[Any], Any]:
        def wrap(fn: Any) -> Any:
            if not deferred() or not isinstance(fn, types.FunctionType):
                materialise()
                return module.optimize(*args, **kwargs)(fn)
            compiled: list[Any] = []

            @functools.wraps(fn)
            def lazily_compiled(*a: Any, **k: Any) -> Any:
                if not compiled:
                    materialise()
                    compiled.append(module.optimize(*args, **kwargs)(fn))
                return compiled[0](*a, **k)

            return lazily_compiled

        return wrap

    d.update({"_pairflow_deferred": True, "__getattr__": __getattr__, "allow_in_graph": allow_in_graph,
              "disable": disable, "assume_constant_result": assume_constant_result, "optimize": optimize,
              "eval_frame": types.SimpleNamespace(OptimizedModule=_NotCompiled)})


def _caller() -> str:
    """The module asking for an attribute: ``importlib._bootstrap`` for ``from torch._dynamo import x``."""
    frame = sys._getframe(2)
    return str(frame.f_globals.get("__name__", "")) if frame is not None else ""


def defer_dynamo() -> bool:
    """Put the guard first on ``sys.meta_path`` (once per process; forked children keep it).
    False, doing nothing, when ``torch._dynamo`` is already imported."""
    with _LOCK:
        if NAME in sys.modules:
            return False
        if not any(isinstance(f, _Deferring) for f in sys.meta_path):
            sys.meta_path.insert(0, _Deferring())
        return True


def materialised() -> bool:
    """Whether dynamo itself was loaded in this process (its ``__init__`` ran)."""
    module = sys.modules.get(NAME)
    return module is not None and not module.__dict__.get("_pairflow_deferred", False)
