"""Evidence: proving a results tree complete, healing it, archiving it.

``verification`` is what ``pairflow verify`` proves; ``healing`` decides at plan time what
a rerun must recompute; ``archive`` promotes compact evidence from scratch to work storage
in sealed packs."""
