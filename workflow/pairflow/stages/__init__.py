"""The pipeline's heavy stages, one module each, in the order the Snakefile runs them:
``generation`` (seeded videos through the fixed encoder), ``scoring`` (metrics per
video, fidelity against control) and ``timing`` (the exclusive timed pass). ``jobs``
holds what every panel job does around its tasks (warm-up, sweeping, failures)."""
