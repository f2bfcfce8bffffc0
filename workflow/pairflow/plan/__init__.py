"""The plan: what a study asks for and what it expects to exist.

``config`` turns the YAML into typed, frozen specs (schema, defaults, arm kinds through
``pairflow.arms``); ``candidates`` lists every (prompt, seed, arm) of a panel and its
files; ``context`` is a panel job's study context, written once and read per worker.
Above ``arms`` and ``metrics`` (a config names arm kinds and scorers), below everything
that runs."""
