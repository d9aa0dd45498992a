"""The one-token decode attention path (two batched matmuls, fp32 softmax) equals SDPA with GQA."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from freetoken.models.attention import Attention


class _Heads:
    """Just what ``Attention._decode_attention`` reads."""

    def __init__(self, nh: int, nkv: int, hd: int) -> None:
        self.nh, self.nkv, self.hd, self.scale = nh, nkv, hd, hd**-0.5


@pytest.mark.parametrize("nh,nkv,hd,n", [(8, 2, 128, 200), (4, 4, 64, 1), (6, 3, 48, 37),
                                         (16, 2, 256, 1025)])
def test_decode_attention_equals_sdpa(nh, nkv, hd, n):
    g = torch.Generator().manual_seed(n)
    q = torch.randn(nh, hd, generator=g)
    keys, values = torch.randn(nkv, n, hd, generator=g), torch.randn(nkv, n, hd, generator=g)
    out = Attention._decode_attention(_Heads(nh, nkv, hd), q, keys, values)
    ref = F.scaled_dot_product_attention(q[None, :, None], keys[None], values[None],
                                         scale=hd**-0.5, enable_gqa=nh != nkv)
    assert out.shape == (1, nh * hd) and out.dtype == torch.float32
    torch.testing.assert_close(out, ref[0, :, 0].reshape(1, nh * hd), rtol=1e-5, atol=1e-6)
