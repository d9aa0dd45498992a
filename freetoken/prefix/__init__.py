"""Prefix reuse: paged KV pool, radix tree, recurrent-state checkpoints, anchors (paper §3.1)."""
