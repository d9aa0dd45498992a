"""Model families (Qwen3-MoE, Qwen3-Next), their checkpoint loader and the tiny-checkpoint maker.

Entry points: ``registry.load_model`` and ``tiny.make_tiny`` / ``tiny.default_model_path``.
"""
