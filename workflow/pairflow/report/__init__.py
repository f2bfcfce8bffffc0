"""The report: what a reader sees of a finished (or running) study.

``table`` (Markdown and HTML), ``plots``, ``gallery``, ``export`` (tidy rows), ``tracker``
(MLflow) and ``status`` (a running study's progress)."""
