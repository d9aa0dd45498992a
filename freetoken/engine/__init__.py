"""The serving engine: request queue, generation loop, sampling, detokenisation, stops.

Modules (one concern each):

* ``client``: :class:`EngineClient`, the async interface the HTTP layer uses.
* ``async_engine``: :class:`AsyncEngine`, the EngineClient running the loop in a thread.
* ``engine``: :class:`Engine`, ``step() = schedule -> execute -> update``.
* ``scheduler``: waiting queue, running request, token budget (chunked prefill).
* ``batch``: ``ScheduledBatch`` / ``ForwardOutput``, the scheduler/runner boundary.
* ``runner``: model + per-request ``SequenceState`` and generator; forward and sample.
* ``sampler``: greedy / temperature / top-k / top-p, seeded generators, logprobs.
* ``detokenizer``: incremental UTF-8-safe detokenisation.
* ``stop``: stop-string matching with holdback.
* ``output``: stop conditions and ``GenerationOutput`` chunks per request.
* ``request``: the engine's per-request record and finish log line.
* ``validate``: request checks (``ContextLengthError`` for empty / too-long prompts).
"""
