"""The model runner: owns the model and every live request's state, runs forward and samples.

For each :class:`ScheduledBatch` it feeds ``token_ids`` into the request's
:class:`~freetoken.models.base.SequenceState` (created on the request's first chunk together
with its seeded ``torch.Generator``) and, when ``batch.sample`` is set, samples the next token
from the last position's logits. A failure in the model or the sampler is caught and returned
as ``ForwardOutput.error`` (the request's state is dropped) so the engine keeps serving.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from freetoken.engine.batch import ForwardOutput, ScheduledBatch
from freetoken.engine.sampler import make_generator, sample
from freetoken.models.base import CausalLM, SequenceState

logger = logging.getLogger("freetoken.engine")


@dataclass
class _Slot:
    state: SequenceState
    generator: torch.Generator


def model_device(model: torch.nn.Module) -> torch.device:
    """Device of the model's first parameter or buffer (CPU for a parameterless module)."""
    for tensor in (*model.parameters(), *model.buffers()):
        return tensor.device
    return torch.device("cpu")


class ModelRunner:
    """Runs one request's forward passes against its own state.

    Args:
        model: the causal LM (already on its device, in eval mode).
        device: where input ids and generators live (default: the model's device).
        sampleable_vocab: number of token ids the tokenizer can decode; the model's padded
            embedding rows beyond it (config ``vocab_size`` rounds the tokenizer size up) are
            never sampled and never count in logprobs. None samples every logit column.
        routing_recorder: a ``freetoken.offload.recorder.RoutingRecorder`` (``--record-routing``)
            told each step's request and phase; it receives every MoE layer's top-k ids.

    Step boundaries: when the model has an offload runtime (``model.moe_runtime``), its
    ``begin_step()`` / ``end_step()`` run around every forward, which is where a live expert-cache
    resize lands.
    """

    def __init__(
        self,
        model: CausalLM,
        device: torch.device | str | None = None,
        sampleable_vocab: int | None = None,
        routing_recorder=None,
    ) -> None:
        self.model = model
        self.moe_runtime = getattr(model, "moe_runtime", None)
        self.routing_recorder = routing_recorder
        if routing_recorder is not None:
            model.set_routing_observer(routing_recorder.record)
        self.device = torch.device(device) if device is not None else model_device(model)
        self.sampleable_vocab = sampleable_vocab
        self._slots: dict[int, _Slot] = {}

    @property
    def num_live_states(self) -> int:
        """Requests whose state is currently held."""
        return len(self._slots)

    def execute(self, batch: ScheduledBatch) -> ForwardOutput:
        """Run ``batch`` through the model and sample if asked.

        Returns:
            The sampled token (and logprobs), nothing for a non-final prefill chunk, or the
            error message when the model or sampler raised.
        """
        try:
            with torch.inference_mode():
                return self._execute(batch)
        except Exception as exc:  # noqa: BLE001 - any model failure must end only this request
            logger.exception("forward failed for request key %d", batch.request_key)
            self.release(batch.request_key)
            return ForwardOutput(batch.request_key, error=f"{type(exc).__name__}: {exc}")

    def release(self, request_key: int) -> None:
        """Drop a request's state (finished, aborted or failed); a no-op when absent."""
        self._slots.pop(request_key, None)

    def _forward(self, batch: ScheduledBatch, ids: torch.Tensor,
                 state: SequenceState) -> torch.Tensor:
        if self.routing_recorder is not None:
            decode = batch.num_computed_tokens > 0 and len(batch.token_ids) == 1
            self.routing_recorder.begin_step(batch.request_key, 1 if decode else 0)
        runtime = self.moe_runtime
        if runtime is None:
            return self.model(ids, state)
        runtime.begin_step()
        try:
            return self.model(ids, state)
        finally:
            runtime.end_step()

    def _execute(self, batch: ScheduledBatch) -> ForwardOutput:
        slot = self._slots.get(batch.request_key)
        if batch.num_computed_tokens == 0:
            slot = _Slot(self.model.new_state(), make_generator(batch.sampling.seed, self.device))
            self._slots[batch.request_key] = slot
        elif slot is None:
            raise RuntimeError(f"no state for request key {batch.request_key}")
        if slot.state.num_tokens != batch.num_computed_tokens:
            raise RuntimeError(
                f"state holds {slot.state.num_tokens} tokens, scheduler expects "
                f"{batch.num_computed_tokens}"
            )
        ids = torch.tensor(batch.token_ids, dtype=torch.long, device=self.device)  # [T]
        logits = self._forward(batch, ids, slot.state)  # [1, V]
        if not batch.sample:
            return ForwardOutput(batch.request_key)
        last = logits[-1]  # [V]
        if self.sampleable_vocab is not None and self.sampleable_vocab < last.shape[-1]:
            last = last[: self.sampleable_vocab]
        picked = sample(last, batch.sampling, slot.generator)
        return ForwardOutput(batch.request_key, picked.token_id, picked.logprob, picked.top)
