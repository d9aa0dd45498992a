"""Per-request logit bias (OpenAI ``logit_bias``) added to a step's ``[B, V]`` logits.

Each biased request's pairs become two small device tensors once, when its state is created
(``ids`` ``[N]`` long, ``values`` ``[N]`` float32); a step adds all of them with one
``index_put`` on a copy of the logits (the raw logits stay for logprobs). A step while no live
request has a bias does no work: the runner tests :class:`LogitBiases` for truth (an empty dict)
and uses the logits as they are.

Shapes: B = batch rows, V = vocabulary size, N = biased ids of one request.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


class LogitBiases:
    """The bias tensors of the live requests that have one, by request key."""

    def __init__(self) -> None:
        self._by_key: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def __bool__(self) -> bool:
        return bool(self._by_key)

    def add(self, request_key: int, pairs: tuple[tuple[int, float], ...],
            device: torch.device) -> None:
        """Hold ``pairs`` (``(token_id, bias)``, ids already checked against the vocabulary) for
        ``request_key``; nothing is held for an empty tuple."""
        if not pairs:
            self._by_key.pop(request_key, None)
            return
        ids = torch.tensor([t for t, _ in pairs], dtype=torch.long, device=device)  # [N]
        values = torch.tensor([b for _, b in pairs], dtype=torch.float32, device=device)  # [N]
        self._by_key[request_key] = (ids, values)

    def discard(self, request_key: int) -> None:
        """Forget a request's bias (finished, aborted or preempted); no-op when absent."""
        self._by_key.pop(request_key, None)

    def apply(self, logits: torch.Tensor, row_keys: Sequence[int | None]) -> torch.Tensor:
        """``logits`` (``[B, V]``) with each row's bias added, as a new float32 tensor.

        Args:
            logits: the step's logits, one row per entry of ``row_keys``.
            row_keys: the request key sampling from each row, or None for a row that does not
                sample (a non-final prefill chunk).

        Returns:
            ``logits`` itself when no row has a bias, else a biased float32 copy.
        """
        rows, ids, values = [], [], []
        for row, key in enumerate(row_keys):
            held = self._by_key.get(key) if key is not None else None
            if held is None:
                continue
            rows.append(torch.full_like(held[0], row))  # [N]
            ids.append(held[0])
            values.append(held[1])
        if not rows:
            return logits
        biased = logits.to(torch.float32, copy=True)  # [B, V]
        biased.index_put_((torch.cat(rows), torch.cat(ids)), torch.cat(values), accumulate=True)
        return biased
