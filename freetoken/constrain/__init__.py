"""Grammar-constrained decoding: forced tool calls (``tool_choice`` required / named / any) and
JSON answers of a schema (structured outputs).

:mod:`~freetoken.constrain.spec` describes the constraint (plain data on ``SamplingParams``),
:mod:`~freetoken.constrain.lark` and :mod:`~freetoken.constrain.answer` turn it into an
llguidance Lark grammar and :mod:`~freetoken.constrain.matcher` compiles it and masks logits
step by step.
"""

from freetoken.constrain.spec import (
    GrammarError,
    JsonAnswerGrammar,
    ToolCallGrammar,
    ToolSchema,
    json_answer_grammar,
    tool_call_grammar,
)

__all__ = ["GrammarError", "JsonAnswerGrammar", "ToolCallGrammar", "ToolSchema",
           "json_answer_grammar", "tool_call_grammar"]
