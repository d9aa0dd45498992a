"""The contract every model family implements.

A model is a ``torch.nn.Module`` that runs one sequence at a time against a per-request
:class:`SequenceState` (attention KV cache + Gated DeltaNet conv/recurrent state). Positions are
implicit: the state knows how many tokens it has already consumed.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch


class SequenceState(ABC):
    """Per-request cache of one sequence.

    Attributes:
        num_tokens: tokens already consumed (the position of the next token).
    """

    num_tokens: int


class CausalLM(torch.nn.Module, ABC):
    """A causal language model over a per-request state.

    Attributes:
        config: the engine's flat view of the HF config (``freetoken.models.config.ModelConfig``).
    """

    @abstractmethod
    def new_state(self) -> SequenceState:
        """Return an empty state for a new sequence (no tokens consumed)."""

    @abstractmethod
    def forward(
        self, input_ids: torch.Tensor, state: SequenceState, all_logits: bool = False
    ) -> torch.Tensor:
        """Consume ``input_ids`` after ``state.num_tokens`` earlier tokens.

        Long inputs are processed internally in chunks so memory stays bounded (a 30k-token
        prompt must not materialise a [T, T] attention matrix).

        Args:
            input_ids: ``[T]`` int64 token ids, T >= 1 (prefill chunk or one decode token).
            state: updated in place; ``state.num_tokens`` grows by T.
            all_logits: return logits for every position instead of only the last one.

        Returns:
            ``[T, V]`` float32 logits if ``all_logits`` else ``[1, V]`` for the last position.
        """

    def forward_batch(self, inputs: list[torch.Tensor],
                      states: list[SequenceState]) -> torch.Tensor:
        """One step over ``B`` sequences; this default runs :meth:`forward` on each in turn.

        Families that can share work across sequences (``DecoderLM``) override it.

        Args:
            inputs: ``B >= 1`` tensors ``[T_i]`` int64 token ids (prefill chunks / decode tokens).
            states: ``B`` states, each updated in place.

        Returns:
            ``[B, V]`` float32 logits of each sequence's last position.

        Raises:
            ValueError: not lists of equal length >= 1, or what :meth:`forward` raises.
        """
        check_batch(inputs, states)
        return torch.stack([self.forward(ids, state)[-1].float()
                            for ids, state in zip(inputs, states)])


def check_batch(inputs, states) -> None:
    """The argument checks every ``forward_batch`` shares.

    Raises:
        ValueError: not two lists (or tuples) of equal length >= 1.
    """
    if not isinstance(inputs, (list, tuple)) or not isinstance(states, (list, tuple)):
        raise ValueError("forward_batch takes a list of input_ids and a list of states")
    if len(inputs) != len(states):
        raise ValueError(f"forward_batch got {len(inputs)} inputs but {len(states)} states")
    if not inputs:
        raise ValueError("forward_batch needs at least one sequence")
