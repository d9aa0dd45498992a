"""W1-W4 replay of recorded agent conversations against any OpenAI- or Anthropic-compatible
endpoint (``evals/run.py``) and side-by-side reports (``evals/compare.py``).

Modules, one concern each:

* :mod:`~evals.replay.traces` - trace files -> calls in recorded order with dependencies;
* :mod:`~evals.replay.workloads` - W1-W4 folders, harness per file, plan building;
* :mod:`~evals.replay.w4` - the assembled 13-turn OpenClaw email/calendar session;
* :mod:`~evals.replay.synthetic` - the built-in synthetic trace set;
* :mod:`~evals.replay.convert` - Anthropic <-> OpenAI wire conversion;
* :mod:`~evals.replay.turns` - harness edits and request bodies (max_tokens = recorded output);
* :mod:`~evals.replay.endpoint` - endpoint URL, API key and ``GET /v1/models`` checks (also used
  by ``evals/run_swe.py``);
* :mod:`~evals.replay.client` - the streaming client measuring TTFT and decode tok/s;
* :mod:`~evals.replay.scrape` - FreeToken ``/metrics`` engine statistics;
* :mod:`~evals.replay.warm` - did the endpoint start the run warm (and which runs to compare);
* :mod:`~evals.replay.runner` - dependency-ordered concurrent execution;
* :mod:`~evals.replay.signals` - SIGTERM taking Ctrl-C's clean path;
* :mod:`~evals.replay.report` / :mod:`~evals.replay.plots` - outputs (and the ``--out`` check);
* :mod:`~evals.replay.comparison` - runs side by side, which of them get ratios;
* :mod:`~evals.replay.app` - one run end to end.
"""
