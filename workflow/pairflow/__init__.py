"""PairFlow: paired evaluation of video-generation models.

The package is a house of floors. Each wing (a subpackage) imports only the foundation
and the wings below it, never one above (``tests/test_imports.py`` holds the table and
enforces it). From the ground up, in the order data flows where the floors allow:

- the foundation, flat modules: ``errors``, ``identity``, ``layout``, ``specs``, ``atomic``,
  ``locks``, ``jobenv``, ``envinfo``, ``progress``, ``nvml``, ``jobaccount``;
- ``metrics/``: the metric registry, one module per metric, and the weight mirror;
- ``arms/``: one module per kind of change an arm declares;
- ``plan/``: the study config and the candidates it expects;
- ``records/``: record types, records, manifests, packs and vouchers;
- ``media/``: the fixed encoder recipe and the one decode path;
- ``fleet/``: sites, the Parsl pool, warm workers, telemetry;
- ``generation/``: seeded generation, compute counting, provenance, the tiny model;
- ``budget/``: calibration, estimate, ledger;
- ``analysis/``: paired statistics and repeatability;
- ``report/``: table, plots, gallery, export, tracker, status;
- ``evidence/``: verification, healing, archive;
- ``stages/``: the heavy stages, the calibration worker and ``steps``, the one entry
  layer every rule script calls;
- ``cli``: the ``pairflow`` command, on top.
"""
