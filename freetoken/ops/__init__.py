"""Plain-torch reference kernels (Gated DeltaNet recurrence, causal conv) used by the models."""
