"""The packed checkpoint format (``freetoken convert``): routed experts stored as the runtime's
host banks, read by parallel direct I/O (``manifest``, ``convert``, ``reader``, ``load``)."""
