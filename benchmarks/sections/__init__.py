"""The sections of ``benchmarks/run.py``, one module each (``hash`` is ``hashing``);
``common`` holds what they share."""
