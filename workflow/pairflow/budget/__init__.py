"""The budget: what a study will cost, and what it did cost.

``calibrate`` measures one candidate per arm in a fresh process; ``estimate`` prices a
study from that table before it starts; ``ledger`` attributes every job's slot time."""
