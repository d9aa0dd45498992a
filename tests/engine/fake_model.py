"""Small deterministic stand-ins for a CausalLM, used to test the engine without real weights.

* :class:`RecurrentLM`: a seeded tiny RNN (embedding -> tanh recurrence -> linear head). Its
  logits depend on the whole token history through the per-request state, so any mix-up of
  two requests' states, or a chunked prefill that skips or repeats a token, changes the output.
* :class:`ScriptedLM`: emits a fixed token script after a known prompt length (logit 10 on the
  scripted token, 0 elsewhere), for exact stop-string / EOS / UTF-8 scenarios.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import torch

from freetoken.models.base import CausalLM, SequenceState


@dataclass
class FakeState(SequenceState):
    """``num_tokens`` consumed so far and the RNN hidden vector ``h`` ([D] float32)."""

    num_tokens: int = 0
    h: torch.Tensor | None = None
    history: list[int] = field(default_factory=list)


class _Instrumented(CausalLM):
    """Records every forward call and can sleep or raise on demand (thread-safe counters)."""

    def __init__(self, delay_s: float = 0.0, fail_on_token: int | None = None) -> None:
        super().__init__()
        self.config = None
        self.delay_s = delay_s
        self.fail_on_token = fail_on_token
        self.calls: list[tuple[int, int, int]] = []  # (first input id, num_tokens before, T)
        self._lock = threading.Lock()

    def new_state(self) -> FakeState:
        return FakeState()

    def _record(self, input_ids: torch.Tensor, state: FakeState) -> None:
        assert input_ids.dim() == 1 and input_ids.dtype == torch.long and input_ids.numel() >= 1
        with self._lock:
            self.calls.append((int(input_ids[0]), state.num_tokens, int(input_ids.numel())))
        if self.delay_s:
            time.sleep(self.delay_s)
        if self.fail_on_token is not None and self.fail_on_token in input_ids.tolist():
            raise RuntimeError(f"injected failure on token {self.fail_on_token}")


class RecurrentLM(_Instrumented):
    """Seeded RNN language model over ``vocab_size`` tokens with hidden size ``dim``."""

    def __init__(self, vocab_size: int, dim: int = 16, seed: int = 0, **kwargs) -> None:
        super().__init__(**kwargs)
        g = torch.Generator().manual_seed(seed)
        self.embed = torch.nn.Parameter(torch.randn(vocab_size, dim, generator=g))
        self.mix = torch.nn.Parameter(torch.randn(dim, dim, generator=g) / dim**0.5)
        self.head = torch.nn.Parameter(torch.randn(dim, vocab_size, generator=g) * 3)

    def forward(self, input_ids: torch.Tensor, state: FakeState, all_logits: bool = False):
        self._record(input_ids, state)
        h = state.h if state.h is not None else torch.zeros(self.mix.shape[0])
        outs = []
        for tok in input_ids.tolist():
            h = torch.tanh(h @ self.mix + self.embed[tok])
            outs.append(h)
            state.history.append(tok)
        state.h = h
        state.num_tokens += input_ids.numel()
        hs = torch.stack(outs) if all_logits else outs[-1][None]  # [T or 1, D]
        return hs @ self.head  # [T or 1, V]


class ScriptedLM(_Instrumented):
    """Emits ``script[n - prompt_len]`` after ``n`` consumed tokens, then ``filler`` forever."""

    def __init__(self, vocab_size: int, prompt_len: int, script: list[int], filler: int,
                 **kwargs) -> None:
        super().__init__(**kwargs)
        self.vocab_size = vocab_size
        self.prompt_len = prompt_len
        self.script = list(script)
        self.filler = filler

    def target(self, num_tokens: int) -> int:
        i = num_tokens - self.prompt_len
        return self.script[i] if 0 <= i < len(self.script) else self.filler

    def forward(self, input_ids: torch.Tensor, state: FakeState, all_logits: bool = False):
        self._record(input_ids, state)
        start = state.num_tokens
        state.num_tokens += input_ids.numel()
        ends = range(start + 1, state.num_tokens + 1) if all_logits else [state.num_tokens]
        logits = torch.zeros(len(ends), self.vocab_size)
        for row, n in enumerate(ends):
            logits[row, self.target(n)] = 10.0
        return logits
