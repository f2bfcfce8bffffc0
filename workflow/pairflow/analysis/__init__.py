"""Analysis: paired statistics with honest intervals.

``inference`` is one cell's test and interval; ``stats`` pairs treatment with control
across a panel and a study; ``repeat`` measures the noise floor from repeatability reruns;
``spending`` is a group-sequential plan's boundaries (alpha spending, the
Armitage-McPherson-Rowe recursion, expected prompts) and ``groupseq`` the stopping over
prompts that reads them (the decision at each look, the interval after a stop, several
questions); ``looks`` binds them to a study that declares looks (``sequential``).
Imports neither torch nor the fleet."""
