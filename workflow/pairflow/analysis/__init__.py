"""Analysis: paired statistics with honest intervals.

``inference`` is one cell's test and interval; ``stats`` pairs treatment with control
across a panel and a study; ``repeat`` measures the noise floor from repeatability reruns.
Imports neither torch nor the fleet."""
