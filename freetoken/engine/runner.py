"""The model runner: owns the model and every live request's state, runs forward and samples.

For each :class:`ScheduledBatch` it builds the state of entries that start a request (empty, or
restored from a reused prefix: the KV slots of the radix match and the recurrent-state
checkpoint), appends each entry's KV slots to its slot table, runs all entries through one
``model.forward_batch`` (decode tokens of several requests and prefill chunks together) and
samples every entry that asks for it with one batched sampler call
(:mod:`freetoken.engine.step_sampling`), each request drawing from its own seeded
``torch.Generator``. A failure in the model or the sampler is caught and returned as
``ForwardOutput.error`` for the entries of that step (their states are dropped) so the engine
keeps serving.

Paged models (``DecoderLM.new_paged_state``) keep attention KV in the shared
:class:`~freetoken.prefix.kv_pool.KVPagePool`; other ``CausalLM`` implementations get their
own ``new_state()`` and no prefix reuse.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from freetoken.engine.batch import ForwardOutput, ScheduledBatch, SeqWork
from freetoken.engine.logit_bias import LogitBiases
from freetoken.engine.sampler import make_generator
from freetoken.engine.step_sampling import GrammarFailed, sample_entries
from freetoken.models.base import CausalLM, SequenceState

logger = logging.getLogger("freetoken.engine")


@dataclass
class _Slot:
    state: SequenceState
    generator: torch.Generator
    table: object = None  # freetoken.models.paged.SlotTable on paged models


def model_device(model: torch.nn.Module) -> torch.device:
    """Device of the model's first parameter or buffer (CPU for a parameterless module)."""
    for tensor in (*model.parameters(), *model.buffers()):
        return tensor.device
    return torch.device("cpu")


class ModelRunner:
    """Runs batches of requests' forward passes against their own states.

    Args:
        model: the causal LM (already on its device, in eval mode).
        device: where input ids and generators live (default: the model's device).
        sampleable_vocab: number of token ids the tokenizer can decode; the model's padded
            embedding rows beyond it (config ``vocab_size`` rounds the tokenizer size up) are
            never sampled and never count in logprobs. None samples every logit column.
        routing_recorder: a ``freetoken.offload.recorder.RoutingRecorder`` (``--record-routing``)
            told each step's first request and phase; it receives every MoE layer's top-k ids.
        prefix: the engine's ``freetoken.prefix.manager.PrefixCache`` (paged KV pool and
            checkpoint store), or None for per-request contiguous states.

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
        prefix=None,
    ) -> None:
        self.model = model
        self.moe_runtime = getattr(model, "moe_runtime", None)
        self.routing_recorder = routing_recorder
        if routing_recorder is not None:
            model.set_routing_observer(routing_recorder.record)
        self.device = torch.device(device) if device is not None else model_device(model)
        self.sampleable_vocab = sampleable_vocab
        self.prefix = prefix
        self._slots: dict[int, _Slot] = {}
        self._biases = LogitBiases()  # live requests with a logit_bias; empty → no bias work
        # request key -> freetoken.constrain.matcher.ToolCallMatcher, set and removed by the
        # engine (kept across preemption: it tracks the output ids, which survive it)
        self.constraints: dict[int, object] = {}

    @property
    def num_live_states(self) -> int:
        """Requests whose state is currently held."""
        return len(self._slots)

    def execute(self, batch: ScheduledBatch) -> list[ForwardOutput]:
        """Run every entry of ``batch`` through the model and sample where asked.

        Returns:
            One output per entry, in order: the sampled token (and logprobs), nothing for a
            non-final prefill chunk, or the error message when the model or sampler raised
            (then every entry of the step fails and their states are dropped). A request with a
            grammar (``constraints``) samples only what its grammar allows; a grammar failure
            is that entry's error alone.
        """
        try:
            with torch.inference_mode():
                return self._execute(batch)
        except Exception as exc:  # noqa: BLE001 - a model failure must end only this step's requests
            keys = [e.request_key for e in batch.entries]
            logger.exception("forward failed for request keys %s", keys)
            for key in keys:
                self.release(key)
            return [ForwardOutput(key, error=f"{type(exc).__name__}: {exc}") for key in keys]

    def release(self, request_key: int) -> None:
        """Drop a request's state (finished, aborted, failed or preempted); no-op when absent."""
        self._slots.pop(request_key, None)
        self._biases.discard(request_key)

    def recurrent_tensors(self, request_key: int) -> Sequence[torch.Tensor] | None:
        """Live recurrent-state tensors of a request (for checkpoints), or None."""
        slot = self._slots.get(request_key)
        fn = getattr(self.model, "recurrent_tensors", None)
        if slot is None or fn is None:
            return None
        return fn(slot.state)

    def _new_slot(self, work: SeqWork) -> _Slot:
        generator = make_generator(work.sampling.seed, self.device)
        if work.sampling.logit_bias:
            self._biases.add(work.request_key, work.sampling.logit_bias, self.device)
        if self.prefix is None:
            if work.num_computed_tokens:
                raise RuntimeError("a restored state needs the prefix cache")
            return _Slot(self.model.new_state(), generator)
        from freetoken.models.paged import SlotTable

        table = SlotTable(work.prefix_slots, device=self.prefix.pool.k.device)
        state = self.model.new_paged_state(self.prefix.pool, table, work.num_computed_tokens)
        if work.restore_checkpoint is not None:
            self.prefix.store.load(work.restore_checkpoint, self.model.recurrent_tensors(state))
        return _Slot(state, generator, table)

    def _slot(self, work: SeqWork) -> _Slot:
        if work.new_state:
            slot = self._new_slot(work)
            self._slots[work.request_key] = slot
        else:
            slot = self._slots.get(work.request_key)
            if slot is None:
                raise RuntimeError(f"no state for request key {work.request_key}")
        if slot.state.num_tokens != work.num_computed_tokens:
            raise RuntimeError(
                f"state holds {slot.state.num_tokens} tokens, scheduler expects "
                f"{work.num_computed_tokens}"
            )
        if slot.table is not None:
            slot.table.extend(work.slots)
        return slot

    def _forward(self, batch: ScheduledBatch, ids: list[torch.Tensor],
                 states: list[SequenceState]):
        if self.routing_recorder is not None:
            first = batch.entries[0]
            decode = all(e.decode for e in batch.entries)
            self.routing_recorder.begin_step(first.request_key, 1 if decode else 0)
        capture = [w.capture for w in batch.entries]
        runtime = self.moe_runtime
        if runtime is not None:
            runtime.begin_step()
        try:
            if any(capture):
                return self.model.forward_batch_capture(ids, states, capture)
            return self.model.forward_batch(ids, states), None
        finally:
            if runtime is not None:
                runtime.end_step()

    def _execute(self, batch: ScheduledBatch) -> list[ForwardOutput]:
        slots = [self._slot(work) for work in batch.entries]
        ids = [torch.tensor(w.token_ids, dtype=torch.long, device=self.device)
               for w in batch.entries]
        logits, snapshots = self._forward(batch, ids, [s.state for s in slots])  # [B, V]
        picked = sample_entries(batch.entries, [s.generator for s in slots], logits,
                                self._biases, self.constraints, self.sampleable_vocab)
        outputs = []
        for row, work in enumerate(batch.entries):
            snaps = ()
            if snapshots is not None:
                snaps = tuple((p, tuple(t)) for p, t in sorted(snapshots[row].items()))
            result = picked.get(row)
            if result is None:  # a non-final prefill chunk
                outputs.append(ForwardOutput(work.request_key, snapshots=snaps))
            elif isinstance(result, GrammarFailed):  # ends this request only
                outputs.append(ForwardOutput(work.request_key, error=result.message))
            else:
                outputs.append(ForwardOutput(work.request_key, result.token_id, result.logprob,
                                             result.top, snapshots=snaps))
        return outputs
