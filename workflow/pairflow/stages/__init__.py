"""The pipeline's heavy stages, one module each, in the order the Snakefile runs them:
``generation`` (seeded videos through the fixed encoder), ``scoring`` (metrics per
video, fidelity against control) and ``timing`` (the exclusive timed pass). ``panel``
runs a panel's generation and scoring in one job (``fleet.panel_jobs: combined``, the
default), feeding score tasks as pairs land. ``jobs`` holds what every panel job does
around its tasks (warm-up, sweeping, failures)."""
