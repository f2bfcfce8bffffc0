"""The fleet: where tasks run and what they cost while running.

``sites`` (local, Slurm; discovered) turns a grant into a Parsl config; ``pool`` fans a
panel's tasks out through a HighThroughputExecutor (``executor``: its pool launched while its
interchange starts); ``workerpool`` and ``preload`` fork
warm workers; ``startup`` and ``telemetry`` record the timeline, spans and NVML samples;
``orphans`` makes sure no process outlives its job. Below generation (which reports
spans) and every stage; knows nothing of models or metrics."""
