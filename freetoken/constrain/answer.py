"""The Lark grammar (llguidance dialect) of a :class:`JsonAnswerGrammar`: a JSON answer.

* json, xml and glm forms: ``start: [think] answer``, or with alternative calls
  ``start: [think] (answer | calls)``; ``think`` and ``calls`` are the forced-call grammar's
  rules (:mod:`freetoken.constrain.lark`), so reasoning stays free text up to ``</think>``;
* harmony form: ``start: [analysis] final``, or ``start: [analysis] (final | call)``;
  ``final`` is ``<|channel|>final<|message|>`` then the answer (``<|return|>``, an EOS id, ends
  it), ``analysis`` and ``call`` the forced-call grammar's harmony rules.

The answer is written with Jinja ``tojson`` spacing (``", "`` / ``": "``, no other whitespace):
whitespace the schema does not need is not left to the model, which could otherwise spend its
``max_tokens`` on it. Object schemas are made strict as tool schemas are (``close_objects``: an
object that lists ``properties`` and does not say ``additionalProperties`` allows no other
key), and keywords llguidance does not implement are ignored (``lenient``).
"""

from __future__ import annotations

import json

from freetoken.constrain.lark import (
    H_CHANNEL,
    H_MESSAGE,
    JSON_OPTIONS,
    TagRef,
    call_rules,
    close_objects,
    harmony_analysis_rules,
    harmony_call_rules,
    json_rule,
    no_tags,
    tag_writer,
    think_rules,
)
from freetoken.constrain.spec import JsonAnswerGrammar


def answer_grammar_text(spec: JsonAnswerGrammar, tag_ref: TagRef = no_tags) -> str:
    """The Lark grammar of ``spec`` (rules in the module docstring).

    Args:
        spec: the JSON-answer description.
        tag_ref: maps tags to special-token references where the tokenizer has them (see
            :func:`freetoken.constrain.lark.grammar_text`).

    Raises:
        GrammarError: the alternative calls cannot be written (see ``grammar_text``).
    """
    tag = tag_writer(tag_ref)
    calls = spec.calls
    if spec.form == "harmony":
        body = "(final | call)" if calls is not None else "final"
        rules = [f"start: analysis? {body}" if spec.reasoning else f"start: {body}"]
        if spec.reasoning:
            rules += harmony_analysis_rules(tag, tag_ref)
        rules.append(f"final: {tag(H_CHANNEL)} {json.dumps('final')} {tag(H_MESSAGE)} answer")
        if calls is not None:
            rules += harmony_call_rules(calls, tag)
    else:
        body = "(answer | calls)" if calls is not None else "answer"
        rules = [f"start: think {body}" if spec.reasoning else f"start: {body}"]
        rules += think_rules(tag_ref) if spec.reasoning else [r'nl: "\n" | "\n\n"']
        if calls is not None:
            rules += call_rules(calls, tag, tag_ref)
    rules.append(f"answer: {json_rule(close_objects(json.loads(spec.schema)), JSON_OPTIONS)}")
    return "\n".join(rules) + "\n"
