"""Keeps pytest out of the bundled task repository.

``repo/`` is the SWE task's project, whose test ``test_median_even_length`` fails on purpose until
an agent fixes the bug; ``evals/run_swe.py`` runs it in a temporary copy. A pytest run that
recurses into ``evals/`` must not collect it.
"""

collect_ignore = ["repo"]
