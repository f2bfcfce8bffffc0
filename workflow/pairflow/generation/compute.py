"""Exact compute per video: block forwards computed vs skipped, and FLOPs.

Counted, never guessed. Hooks on every transformer block (and every attention module
inside one) see each call; a call is *computed* when the module's body ran inside it
and *skipped* when it did not, which is what a diffusers cache does when it returns a
cached residual or attention output instead of running the block (``counting`` says
which signals show it, and how a full count confirms them). The hooks are cheap; FLOPs
are obtained one of two ways, and records say which (``method``):

- ``counted``: ``torch.utils.flop_counter.FlopCounterMode`` runs over the whole pipeline
  call (matmuls, convolutions and attention, exact for the shapes that ran; about 7x the
  plain generation time on CPU). A counted run also *measures* a ``FlopTable``: the FLOPs
  of one call of every hooked unit (the transformer outside its blocks, each block outside
  its attention, each attention module; computed and skipped separately), the pipeline's
  FLOPs outside the transformer per generation, and a search verifier's per scoring.
- ``derived``: hooks only; the FLOPs are the call counts times the table's per-call
  figures. The table is exact only when every call of a unit gave the same FLOPs in the
  measuring run (``FlopTable.exact``); an inexact or incomplete table is never used.

Tables are keyed by (model, arm, shape, schedule, text tokens, device type, library
versions) and kept under scratch (``load_table``/``save_table``), so a figure is
measured once per study, and
a seeded sample of candidates is counted in full and cross-checked against the derived
figure (``stages.generation``). Counting runs in the bulk (untimed) pass only: the timed
pass measures latency without it.

The counts are meant to be hardware-independent: torch's formulas count the matmuls,
convolutions and fused attention kernels of CPU and CUDA alike (the CPU kernel by this
module's formula, ``_attention_formulas``), so the compute ratio (treatment FLOPs /
control FLOPs) is tested on CPU (tests/test_compute.py). An attention kernel outside
aten (flash-attn, SageAttention, xformers) is invisible to FlopCounterMode: a full count
names the computed attention calls in which no attention-core kernel was counted
(``uncounted_attention``; the figure is then a lower bound and its table is never used).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..atomic import write_text
from ..errors import ConfigError
from ..identity import digest_obj

# Lazy on purpose: torch and diffusers are imported inside the functions that count FLOPs: stats imports this
# module without them.

BLOCK_LISTS = ("blocks", "transformer_blocks", "single_transformer_blocks", "temporal_transformer_blocks")
"""Attribute names of the ``ModuleList``s holding a diffusers video transformer's blocks
(Wan: ``blocks``; CogVideoX, LTX, HunyuanVideo: ``transformer_blocks`` and, for
HunyuanVideo, ``single_transformer_blocks``)."""

COUNTER = "torch.utils.flop_counter.FlopCounterMode"
TABLE_VERSION = 2  # 2: cheaper computed/skipped signals, confirmed by full counts; CPU attention counted


@dataclass
class ComputeCount:
    """What one or more pipeline calls did in the transformer. ``latent_shape`` is the
    hidden-states shape of the first transformer call without its batch axis (classifier-
    free guidance batches change only the batch), so two arms that start from the same
    noise show the same shape. ``method``: ``counted`` (FlopCounterMode) or ``derived``
    (hook counts times a measured ``FlopTable``); ``table``: that table's key."""

    blocks_computed: int = 0
    blocks_skipped: int = 0
    attention_computed: int = 0
    attention_skipped: int = 0
    transformer_calls: int = 0
    transformer_flops: int = 0
    total_flops: int = 0
    verifier_flops: int = 0
    generations: int = 0
    latent_shape: list[int] | None = None
    counter: str = COUNTER
    method: str = "counted"
    table: str | None = None
    cross_check: dict[str, Any] | None = None
    # per unit ("outer", "b<i>c", "b<i>s", "a<j>c", "a<j>s"): calls, and FLOPs seen per call
    _calls: dict[str, int] = field(default_factory=dict, repr=False)
    _seen: dict[str, set[int]] = field(default_factory=dict, repr=False)
    _open: dict[int, bool] = field(default_factory=dict, repr=False)
    # computed attention calls in which no attention-core kernel was counted (a kernel outside
    # aten, e.g. flash-attn or SageAttention): the FLOPs are a lower bound, never derived from
    uncounted_attention: int = 0
    # units whose computed/skipped signal a full count's child hooks contradicted
    _mismatch: set[str] = field(default_factory=set, repr=False)

    def asdict(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if not k.startswith("_")}
        if out["cross_check"] is None:
            del out["cross_check"]
        if out["table"] is None:
            del out["table"]
        return {**out, "work_flops": self.work}

    @property
    def work(self) -> int:
        """The FLOPs the compute ratio compares: transformer work plus any verifier scoring."""
        return self.transformer_flops + self.verifier_flops

    def add(self, other: ComputeCount) -> None:
        """Add ``other``'s counts (the search arm's N generations add up to its cost)."""
        for k in ("blocks_computed", "blocks_skipped", "attention_computed", "attention_skipped",
                  "transformer_calls", "transformer_flops", "total_flops", "verifier_flops", "generations",
                  "uncounted_attention"):
            setattr(self, k, getattr(self, k) + getattr(other, k))
        if self.latent_shape is None:
            self.latent_shape = other.latent_shape
        for unit, n in other._calls.items():
            self._calls[unit] = self._calls.get(unit, 0) + n
        for unit, seen in other._seen.items():
            self._seen.setdefault(unit, set()).update(seen)
        self._mismatch |= other._mismatch

    def tally(self, unit: str, flops: int | None = None) -> None:
        self._calls[unit] = self._calls.get(unit, 0) + 1
        if flops is not None:
            self._seen.setdefault(unit, set()).add(int(flops))


@dataclass(frozen=True)
class FlopTable:
    """FLOPs per call of every hooked unit, measured by one counted run (see module doc).
    ``per_call``: unit -> FLOPs of one call; ``rest``: pipeline FLOPs outside the
    transformer per generation; ``verifier``: FLOPs of one verifier scoring (0 without a
    search); ``exact``: every call of every unit gave the same FLOPs."""

    key: str
    per_call: dict[str, int]
    rest: int
    verifier: int
    exact: bool

    def derive(self, count: ComputeCount) -> int | None:
        """The transformer FLOPs of ``count``'s calls, or None when the table cannot say
        (inexact, or a unit called that the measuring run never saw)."""
        if not self.exact or any(unit not in self.per_call for unit in count._calls):
            return None
        return sum(n * self.per_call[unit] for unit, n in count._calls.items())

    def asdict(self) -> dict[str, Any]:
        return {"version": TABLE_VERSION, "key": self.key, "per_call": self.per_call, "rest": self.rest,
                "verifier": self.verifier, "exact": self.exact, "counter": COUNTER}


def measure(count: ComputeCount, key: str, rest: set[int], verifier: set[int]) -> FlopTable:
    """The ``FlopTable`` a counted run measured: ``count`` summed over its generations,
    ``rest`` the pipeline FLOPs outside the transformer seen per generation, ``verifier``
    the FLOPs seen per verifier scoring ({0} without a search)."""
    exact = (all(len(s) == 1 for s in count._seen.values()) and len(rest) == 1 and len(verifier) == 1
             and not count._mismatch and not count.uncounted_attention)
    return FlopTable(key, {u: min(s) for u, s in sorted(count._seen.items())}, min(rest, default=-1),
                     min(verifier, default=0), exact)


def merged(table: FlopTable, other: FlopTable) -> FlopTable | None:
    """``table`` with the units only ``other`` measured, when both are exact and agree on
    every unit, ``rest`` and ``verifier`` they share; else None."""
    if not (table.exact and other.exact) or (table.rest, table.verifier) != (other.rest, other.verifier):
        return None
    if any(other.per_call[u] != v for u, v in table.per_call.items() if u in other.per_call):
        return None
    return FlopTable(table.key, {**other.per_call, **table.per_call}, table.rest, table.verifier, True)


def table_key(model: dict[str, Any], arm: dict[str, Any], generation: dict[str, Any], tokens: int | None,
              device: str) -> str:
    """Digest of what a table's figures depend on: the model's identity, the arm, the
    effective generation settings (shape and schedule), the text tokens, the device type
    (which attention kernels run, so which formulas count them) and the torch and
    diffusers versions (FlopCounterMode's formulas and diffusers' modules)."""
    import diffusers
    import torch

    return digest_obj({"v": TABLE_VERSION, "model": model, "arm": arm, "generation": generation, "tokens": tokens,
                       "device": device, "torch": torch.__version__, "diffusers": diffusers.__version__})


def load_table(folder: Path, key: str) -> FlopTable | None:
    """The table saved under ``folder`` for ``key``, or None (absent, or from another
    table version; a table that does not parse is remeasured, never trusted)."""
    path = Path(folder) / f"{key}.json"
    try:
        d = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(d, dict) or d.get("version") != TABLE_VERSION or d.get("key") != key:
        return None
    return FlopTable(key, {str(k): int(v) for k, v in d["per_call"].items()}, int(d["rest"]), int(d["verifier"]),
                     bool(d["exact"]))


def save_table(folder: Path, table: FlopTable) -> Path:
    """Write ``table`` atomically under ``folder`` (two workers measuring the same key
    write the same bytes), unless an exact table would replace an inexact one: a
    cross-check found that key's table wrong (in any worker), and that verdict stands."""
    path = Path(folder) / f"{table.key}.json"
    saved = load_table(folder, table.key) if table.exact else None
    if saved is not None and not saved.exact:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, json.dumps(table.asdict(), sort_keys=True, indent=1) + "\n")
    return path


def transformer_blocks(transformer: Any) -> list[Any]:
    """The transformer's blocks, in order (every ``BLOCK_LISTS`` ModuleList it has).
    Raises ConfigError when it has none: its compute could not be counted."""
    blocks = [b for name in BLOCK_LISTS for b in (getattr(transformer, name, None) or [])]
    if not blocks:
        raise ConfigError(f"{type(transformer).__name__} has none of the block lists {BLOCK_LISTS}, so its "
                          "compute cannot be counted; "
                         "add its block list's attribute name to pairflow.generation.compute.BLOCK_LISTS")
    return blocks


def _is_attention(module: Any) -> bool:
    return type(module).__name__.endswith("Attention") or type(module).__name__ == "Attention"


def _sdpa_flops(query: Any, key: Any, value: Any, *_args: Any, out_shape: Any = None, **_kwargs: Any) -> int:
    from torch.utils.flop_counter import sdpa_flop_count

    return int(sdpa_flop_count(query, key, value))  # type: ignore[no-untyped-call]


def _attention_formulas() -> dict[Any, Any]:
    """FLOP formulas for the fused attention kernels torch's counter has none for: the CPU
    flash kernel (``scaled_dot_product_attention`` on CPU) and the backend-overridable one.
    Without them FlopCounterMode counts an attention core on CPU as 0 FLOPs (about a fifth of
    the tiny model's transformer FLOPs) while it counts the CUDA kernels, so CPU and GPU
    figures and any attention-skipping arm's ratio would disagree. The formula is torch's
    own for the CUDA kernels (``sdpa_flop_count``, forward only); FlopCounterMode passes it
    the arguments' shapes."""
    import torch

    aten = torch.ops.aten
    names = ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_fused_attention_overrideable")
    return {getattr(aten, n): _sdpa_flops for n in names if hasattr(aten, n)}


def _attention_cores() -> set[Any]:
    """The aten ops an attention core is counted in: the fused kernels (CUDA's flash,
    efficient and cuDNN ones, the CPU and overridable ones ``_attention_formulas`` adds)
    and the batched matmuls the math backend decomposes into."""
    import torch

    aten = torch.ops.aten
    names = ("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
             "_scaled_dot_product_cudnn_attention", "_flash_attention_forward", "_efficient_attention_forward",
             "bmm", "baddbmm")
    return {getattr(aten, n) for n in names if hasattr(aten, n)} | set(_attention_formulas())


def _wrapped(module: Any) -> bool:
    """Whether something can replace ``module``'s forward: a diffusers hook registry (how
    every diffusers cache skips a block or an attention call: it sets the forward on the
    instance) or any other forward set on the instance. An unwrapped module's call runs
    its class's forward: it computes."""
    return hasattr(module, "_diffusers_hook") or "forward" in vars(module)


@contextlib.contextmanager
def counting(transformer: Any, table: FlopTable | None = None, full: bool = True) -> Iterator[ComputeCount]:
    """Count the transformer's block and attention forwards (computed vs skipped) for
    everything run inside the ``with`` block; hooks are removed on exit, even on error.
    ``full``: count FLOPs with FlopCounterMode (and, given ``table``, cross-check the
    figure derived from it: ``count.cross_check``); otherwise derive them from ``table``
    (``count.transformer_flops`` stays -1 when the table cannot say: the caller counts
    again in full). Yields the ComputeCount being filled.

    A call is computed when its body ran. The signals, cheapest first (hooks cost a few
    microseconds per module call, a share of a small model's generation): a block that
    holds attention modules computed when one of them was called inside it; an unwrapped
    attention module (``_wrapped``) always computes; any other watched module computed
    when any of its children was called. A full count also hooks every child of every
    watched module and records each call whose signal disagrees with that (``_mismatch``):
    a table measured so is inexact and a cross-check unequal, so a derivation never rests
    on a signal the measurement did not confirm."""
    from torch.utils.flop_counter import FlopCounterMode

    if not full and table is None:
        raise ValueError("counting(full=False) needs the FlopTable to derive FLOPs from")
    count = ComputeCount()
    handles: list[Any] = []
    flops = FlopCounterMode(display=False, custom_mapping=_attention_formulas()) if full else None
    total = flops.get_total_flops if flops is not None else None
    stack: list[list[int]] = []  # per open unit: [FLOPs at entry, of nested hooked units, attention cores at entry]
    opened = count._open  # id(module) -> computed so far, for every watched call in progress
    audit: dict[int, bool] | None = {} if full else None  # id(module) -> any child called (full counts)
    cores = _attention_cores() if full else set()  # only a full count looks for uncounted attention

    def core_flops() -> int:  # FLOPs counted so far in attention-core kernels (see ComputeCount.uncounted_attention)
        # looked up per call: entering FlopCounterMode clears its counts and starts new dicts
        counted = flops.flop_counts["Global"] if flops is not None else {}
        return sum(counted.get(op, 0) for op in cores)

    def flag(key: int, into: dict[int, bool]) -> Any:
        def hook(_m: Any, _args: Any) -> None:
            if key in into:
                into[key] = True
        return hook

    def watch(module: Any, unit: str, kind: str, always: bool, block: int | None, by_children: bool) -> None:
        key = id(module)
        units = (f"{unit}c", f"{unit}s")
        fields = (f"{kind}_computed", f"{kind}_skipped")

        def pre(_m: Any, _args: Any) -> None:
            opened[key] = always
            if block is not None and block in opened:
                opened[block] = True
            if audit is not None:
                audit[key] = False
            if total is not None:
                stack.append([total(), 0, core_flops() if kind == "attention" else 0])

        def post(_m: Any, _args: Any, _out: Any) -> None:
            ran = opened.pop(key, False)
            setattr(count, fields[not ran], getattr(count, fields[not ran]) + 1)
            if total is None:
                count.tally(units[not ran])
                return
            if audit is not None and audit.pop(key, False) != ran:
                count._mismatch.add(units[not ran])
            entered, nested, core = stack.pop()
            if kind == "attention" and ran and core_flops() == core:
                count.uncounted_attention += 1
            spent = total() - entered
            count.tally(units[not ran], spent - nested)
            if stack:
                stack[-1][1] += spent

        handles.append(module.register_forward_pre_hook(pre))
        handles.append(module.register_forward_hook(post))
        for child in module.children():
            if by_children:
                handles.append(child.register_forward_pre_hook(flag(key, opened)))
            if audit is not None:
                handles.append(child.register_forward_pre_hook(flag(key, audit)))

    attention = 0
    for i, block in enumerate(transformer_blocks(transformer)):
        inner = [sub for sub in block.modules() if sub is not block and _is_attention(sub)]
        watch(block, f"b{i}", "blocks", False, None, not inner)
        for sub in inner:
            wrapped = _wrapped(sub)
            watch(sub, f"a{attention}", "attention", not wrapped, id(block), wrapped)
            attention += 1

    def t_pre(_m: Any, args: Any, kwargs: Any) -> None:
        if total is not None:
            stack.append([total(), 0, 0])
        if count.latent_shape is None:
            hidden = kwargs.get("hidden_states", args[0] if args else None)
            if hidden is not None and hasattr(hidden, "shape"):
                count.latent_shape = list(hidden.shape[1:])

    def t_post(_m: Any, _args: Any, _out: Any) -> None:
        count.transformer_calls += 1
        if total is None:
            count.tally("outer")
            return
        entered, nested, _ = stack.pop()
        spent = total() - entered
        count.transformer_flops += spent
        count.tally("outer", spent - nested)

    handles.append(transformer.register_forward_pre_hook(t_pre, with_kwargs=True))
    handles.append(transformer.register_forward_hook(t_post))
    try:
        with flops if flops is not None else contextlib.nullcontext():
            yield count
        count.generations = max(count.generations, 1)
        if flops is not None:
            count.total_flops = int(flops.get_total_flops())
            count.transformer_flops = int(count.transformer_flops)
            if table is not None:
                derived = table.derive(count)
                count.table = table.key
                count.cross_check = {"derived_transformer_flops": derived,
                                     "equal": derived == count.transformer_flops and not count._mismatch
                                     and table.rest == count.total_flops - count.transformer_flops}
        else:
            assert table is not None
            derived = table.derive(count)
            count.method, count.table = "derived", table.key
            count.transformer_flops = -1 if derived is None else derived
            count.total_flops = -1 if derived is None else derived + table.rest
    finally:
        for h in handles:
            h.remove()


BF16_DENSE_PEAK_TFLOPS: tuple[tuple[str, str, float], ...] = (
    # (substring of torch's device name, model, dense BF16 tensor-core TFLOP/s from NVIDIA's
    # datasheets; the "with sparsity" figures are twice these). Most specific names first.
    ("GH200", "GH200", 989.0),
    ("GB200", "GB200 (per GPU)", 2500.0),
    ("B200", "B200", 2250.0),
    ("H200 NVL", "H200 NVL", 835.0),
    ("H200", "H200 SXM", 989.0),
    ("H100 NVL", "H100 NVL", 835.0),
    ("H100 PCIe", "H100 PCIe", 756.0),
    ("H100", "H100 SXM", 989.0),
    ("A100", "A100", 312.0),
    ("L40S", "L40S", 362.0),
)
"""Dense BF16 peaks for estimated MFU (``estimated_mfu``), of whole GPUs only (``MIG_SLICE``)."""
MIG_SLICE = ("a MIG slice (torch names it '<GPU> MIG <profile>'): it has a share of the GPU's SMs, so the whole "
             "GPU's datasheet peak does not apply and no estimated MFU is given")


def bf16_peak(device_name: str) -> tuple[str, float] | None:
    """(model, dense BF16 peak FLOP/s) of the GPU torch names ``device_name``, or None when
    the table does not know it or the device is a MIG slice (``MIG_SLICE``: "NVIDIA H200
    MIG 1g.18gb" contains "H200" but has a seventh of its SMs): then no MFU is estimated
    rather than a wrong one."""
    if "MIG" in device_name.split():
        return None
    for needle, model, tflops in BF16_DENSE_PEAK_TFLOPS:
        if needle.lower() in device_name.lower():
            return model, tflops * 1e12
    return None


def estimated_mfu(flops: float, latency_s: float, device_name: str) -> dict[str, Any] | None:
    """Estimated model FLOPs utilisation, the PaLM convention: forward FLOPs actually
    counted for the call (no backward, no rematerialisation) over the timed latency over
    the device's dense BF16 peak. "Estimated": the peak is a datasheet figure, not this
    board's clocks. None when the device is not in ``BF16_DENSE_PEAK_TFLOPS``, is a MIG
    slice (``MIG_SLICE``), or the latency is not positive."""
    peak = bf16_peak(device_name)
    if peak is None or latency_s <= 0:
        return None
    return {"mfu": flops / latency_s / peak[1], "peak_tflops": peak[1] / 1e12, "gpu": peak[0],
            "convention": "estimated: counted forward FLOPs / timed latency / datasheet dense BF16 peak (PaLM)"}
