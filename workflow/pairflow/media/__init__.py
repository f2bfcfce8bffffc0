"""Media: the one fixed encoder recipe, frame and stream checks, one decode path.

``video`` is the seam to FFmpeg (write guards, probe, read guards, decode); ``h264`` reads
what an H.264 stream declares that PyAV does not report."""
