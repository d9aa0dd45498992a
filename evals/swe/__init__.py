"""Parts of ``evals/run_swe.py``: the SWE task (``task``), the agent (``agent``), the recording relay
(``relay``, ``calls``) and the report (``report``)."""
