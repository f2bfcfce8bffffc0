"""The verdict vocabulary, and the one way every report words a verdict with its p.

Six verdicts, worded as the CONSORT extension for non-inferiority and equivalence trials
(Piaggio et al., JAMA 2012, figure 1) reads a confidence interval against a margin M (a
loss of M in the metric's direction is the most that still counts as not worse):

* ``superior``: the whole interval lies on the better side of 0 (and so inside the margin);
* ``non-inferior``: the whole interval lies on the better side of the loss edge -M;
* ``equivalent``: the whole interval lies inside (-M, +M);
* ``worse, non-inferiority not shown``: the whole interval lies on the worse side of 0 but
  still holds -M (worse than control, by an amount that may be tolerable);
* ``inferior``: the whole interval lies beyond -M (worse by more than the margin);
* ``inconclusive``: the interval holds 0 and -M.

A metric without a margin is read with M = 0 (superior, inferior or inconclusive); an FR
metric's floor is its loss edge, and it has no 0 (non-inferior, inferior or inconclusive).
Each verdict carries the p of the test that decided it and that test's family: the cell's
own question is in the table's multiplicity family (Holm or Benjamini-Hochberg, adjusted p);
a second value read from the same interval (0 for superior or worse, +M for equivalent) is
tested outside the family at the cell's adjusted level, and its p is scaled to that level
(p x alpha / alpha_cell) so that, like the adjusted p, it is below alpha exactly when the
word claims it. A word other than inconclusive never sits beside a p at or above alpha,
and inconclusive never beside one below it.

Every HTML report colours a verdict's phrase the same way (``COLOURS``, through
``colour_verdicts``): the study and panel tables, the Verdicts table, the answer line and
the gallery's verdict line. Imports without torch.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ..records.types import VerdictCode

PHRASES: dict[VerdictCode, str] = {
    "superior": "superior",
    "non_inferior": "non-inferior",
    "equivalent": "equivalent",
    "worse_non_inferiority_not_shown": "worse, non-inferiority not shown",
    "inferior": "inferior",
    "inconclusive": "inconclusive",
}
"""Machine-readable code -> the phrase every report prints."""
CLAIMS: frozenset[VerdictCode] = frozenset(c for c in PHRASES if c != "inconclusive")
"""The codes that claim something: their deciding p is below alpha."""


COLOURS: dict[VerdictCode, str] = {
    "superior": "#1b7837",
    "non_inferior": "#1b7837",
    "equivalent": "#1b7837",
    "worse_non_inferiority_not_shown": "#b35806",
    "inferior": "#c5221f",
    "inconclusive": "#5f6368",
}
"""Verdict code -> the CSS colour every HTML report draws its phrase in: green where the
treatment is shown no worse than the margin allows (superior, non-inferior, equivalent),
amber where it is shown worse but within the margin, red where worse beyond it, grey where
nothing is shown. Each reads at least 4.5:1 against white (WCAG AA for text), so the
word stays legible in print and for readers who do not see the hue; the word itself
always carries the meaning."""

_PHRASE_RE = re.compile(r"(?<![\w-])(" + "|".join(re.escape(p) for p in sorted(PHRASES.values(), key=len, reverse=True))
                        + r")(?![\w-])")
"""A verdict phrase standing alone: longest first, so ``worse, non-inferiority not shown`` is
one match and ``non-inferior`` never yields an ``inferior``; no word character or hyphen on
either side, so ``non-inferiority`` (a test's name) and ``equivalence`` are not verdicts."""
_CODES = {p: c for c, p in PHRASES.items()}


def verdict_colour(code: VerdictCode) -> str:
    """The CSS colour of a verdict code's phrase in every HTML report (``COLOURS``)."""
    return COLOURS[code]


def colour_verdicts(escaped: str) -> str:
    """HTML-escaped text with every verdict phrase in it wrapped as
    ``<span class='verdict' data-verdict='CODE' style='color:...'>phrase</span>``: the one
    way the study table, the answer line and the gallery colour a verdict. Pass text
    already escaped (the phrases hold no character HTML escapes)."""
    def span(m: re.Match[str]) -> str:
        code = _CODES[m.group(1)]
        return (f"<span class='verdict' data-verdict='{code}' style='color:{COLOURS[code]};font-weight:bold'>"
                f"{m.group(1)}</span>")
    return _PHRASE_RE.sub(span, escaped)


def phrase(code: VerdictCode) -> str:
    """The printed phrase of a verdict code."""
    return PHRASES[code]


def family_label(in_family: bool, method: str, family_size: int) -> str:
    """How the deciding test's p was adjusted: ``Holm over the table's 12 tests`` for the
    cell's own question, or the scaled p of a value tested outside the family."""
    if in_family:
        return f"{method} over the table's {family_size} test{'s' if family_size != 1 else ''}"
    return f"outside the family, scaled to this cell's {method} level"


def verdict_text(m: Mapping[str, Any]) -> str:
    """A metric's verdict as every report prints it (table cell, answer line, Verdicts
    table, export, gallery, forest plot): the phrase and the p of the test that decided it
    with that test's family, e.g. ``worse, non-inferiority not shown (p 0.003: difference
    from 0, outside the family, scaled to this cell's Holm level)``; ``value only`` where
    the metric has no question, and the reason where it has no verdict."""
    code = m.get("verdict_code")
    if code is None:
        return "value only"
    out = phrase(code)
    p = m.get("p_verdict")
    if p is not None:
        out += f" (p {_p(p)}: {m.get('p_verdict_test')}, {m.get('p_verdict_family')})"
    return out


def _p(p: float) -> str:
    """Two significant digits, never rounded down to 0."""
    return f"{p:.2g}" if p >= 1e-4 else "< 0.0001"
