"""Analysis: paired statistics with honest intervals.

``inference`` is one cell's test and interval; ``stats`` pairs treatment with control
across a panel and a study; ``repeat`` measures the noise floor from repeatability reruns;
``groupseq`` is group-sequential stopping over prompts (alpha-spending boundaries and the
decision at each look; not yet called by any stage). Imports neither torch nor the fleet."""
