"""The report: what a reader sees of a finished (or running) study.

``table`` (Markdown and HTML), ``plots``, ``gallery`` with ``media_budget`` (what the page
inlines under its size caps), ``export`` (tidy rows), ``tracker`` (MLflow) and ``status``
(a running study's progress)."""
