"""The serving engine: request queue, generation loop, sampling, detokenisation, stops.

Modules (one concern each):

* ``client``: :class:`EngineClient`, the async interface the HTTP layer uses.
* ``async_engine``: :class:`AsyncEngine`, the EngineClient running the loop in a thread.
* ``engine``: :class:`Engine`, ``step() = schedule -> execute -> update``.
* ``scheduler``: waiting queue, running request, token budget (chunked prefill).
* ``batch``: ``ScheduledBatch`` / ``ForwardOutput``, the scheduler/runner boundary.
* ``runner``: model + per-request ``SequenceState`` and generator; forward and sample.
* ``step_sampling``: a step's sampling rows, logit bias and grammar masks, one sampler call.
* ``batch_sampler``: ``[B, V]`` sampling in one call (greedy argmax, seeded draws, logprobs).
* ``sampling_rows``: a step's per-request sampling parameters gathered into tensors.
* ``batch_filters``: temperature / top-k / top-p over rows, each with its own values.
* ``seeded_draw``: one draw per row from its own generator, as ``torch.multinomial`` draws.
* ``sampler``: the per-row reference (greedy / temperature / top-k / top-p, logprobs).
* ``detokenizer``: incremental UTF-8-safe detokenisation.
* ``stop``: stop-string matching with holdback.
* ``output``: stop conditions and ``GenerationOutput`` chunks per request.
* ``request``: the engine's per-request record and finish log line.
* ``validate``: request checks (``ContextLengthError`` for empty / too-long prompts).
"""
