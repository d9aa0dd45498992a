"""Grammar-constrained decoding for forced tool calls (``tool_choice`` required / named / any).

:mod:`~freetoken.constrain.spec` describes the constraint (plain data on ``SamplingParams``),
:mod:`~freetoken.constrain.lark` turns it into an llguidance Lark grammar and
:mod:`~freetoken.constrain.matcher` compiles it and masks logits step by step.
"""

from freetoken.constrain.spec import GrammarError, ToolCallGrammar, ToolSchema, tool_call_grammar

__all__ = ["GrammarError", "ToolCallGrammar", "ToolSchema", "tool_call_grammar"]
