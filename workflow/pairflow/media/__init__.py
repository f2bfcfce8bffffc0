"""Media: the one fixed encoder recipe, frame and stream checks, one decode path.

``video`` writes and reads (its public surface re-exports the parts'); ``frames`` checks
frames before encoding; ``recipe`` is the fingerprinted encoder recipe; ``tools`` runs
ffmpeg with a timeout derived from the work; ``probe`` reads what a video declares and
holds the one read rule; ``h264`` reads what an H.264 stream declares that PyAV does not
report alone; ``mp4`` reads the colour an MP4 container's ``colr`` boxes declare."""
