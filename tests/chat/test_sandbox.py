"""ChatTemplate: HF jinja semantics, sandboxing, input normalisation and error messages."""

from __future__ import annotations

import copy
from datetime import datetime

import pytest

from freetoken import paths
from freetoken.chat.template import ChatTemplate, TemplateError


def _render(source: str, messages=None, **kwargs) -> str:
    return ChatTemplate(source, name="t").render(messages or [{"role": "user", "content": "x"}], **kwargs)


def test_tojson_keeps_unicode_and_html_and_accepts_hf_arguments():
    value = {"b": "é<&>'", "a": [1, 2]}
    assert _render("{{ v | tojson }}", v=value) == '{"b": "é<&>\'", "a": [1, 2]}'
    assert _render("{{ v | tojson(ensure_ascii=true) }}", v=value) == '{"b": "\\u00e9<&>\'", "a": [1, 2]}'
    assert _render("{{ v | tojson(separators=(',', ':'), sort_keys=true) }}", v=value) == '{"a":[1,2],"b":"é<&>\'"}'
    assert _render("{{ v | tojson(indent=2) }}", v={"a": 1}) == '{\n  "a": 1\n}'


def test_trim_and_lstrip_blocks():
    source = "{% for m in messages %}\n    {% if m.content %}\n{{ m.content }}\n    {% endif %}\n{% endfor %}"
    messages = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    assert _render(source, messages) == "a\nb\n"


def test_loop_controls_and_namespace():
    source = (
        "{% set ns = namespace(n=0) %}{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}"
        "{% if i > 4 %}{% break %}{% endif %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}"
    )
    assert _render(source) == "8"


def test_generation_block_renders_its_body():
    assert _render("A{% generation %}B{{ 1 + 1 }}{% endgeneration %}C") == "AB2C"


def test_strftime_now_is_the_local_date():
    before = datetime.now().strftime("%Y-%m-%d")
    out = _render("{{ strftime_now('%Y-%m-%d') }}")
    assert out in (before, datetime.now().strftime("%Y-%m-%d"))


def test_raise_exception_message_is_the_error():
    with pytest.raises(TemplateError) as err:
        _render("{{ raise_exception('System message must be at the beginning.') }}")
    assert str(err.value) == "chat template t: System message must be at the beginning."
    assert isinstance(err.value, ValueError)


def test_enable_thinking_none_is_undefined_and_special_tokens_are_variables():
    tpl = ChatTemplate("{{ enable_thinking is defined }}|{{ eos_token }}|{{ bos_token is defined }}",
                       special_tokens={"eos_token": "<|im_end|>", "bos_token": None})
    assert tpl.render([]) == "False|<|im_end|>|False"
    assert tpl.render([], enable_thinking=False) == "True|<|im_end|>|False"


def test_none_values_are_dropped_and_reasoning_aliases_filled():
    source = "{{ 'content' in messages[0] }}|{{ messages[0].reasoning_content }}"
    assert _render(source, [{"role": "assistant", "content": None, "reasoning": "r"}]) == "False|r"
    assert _render(source, [{"role": "assistant", "content": None, "thinking": "t"}]) == "False|t"


def test_render_does_not_modify_the_callers_messages(qwen3):
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "x"}]},
        {"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f", "arguments": '{"a": 1}'}}]},
    ]
    snapshot = copy.deepcopy(messages)
    qwen3.render(messages)
    assert messages == snapshot


@pytest.mark.parametrize(
    "source",
    [
        "{{ ''.__class__ }}",
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{% for c in ''.__class__.__mro__ %}{{ c }}{% endfor %}",
        "{{ cycler.__init__.__globals__ }}",
        "{{ raise_exception.__globals__['os'] }}",
        "{{ namespace.__init__.__globals__ }}",
        "{{ messages.__class__.__base__ }}",
        "{{ messages.append(1) }}",
        "{{ messages[0].update({'role': 'x'}) }}",
        "{% set ns = namespace(_secret=1) %}",
        "{% set ns = namespace() %}{% set ns._x = 1 %}",
        "{{ self.__dict__ }}",
        "{{ ''.format.__globals__ }}",
        "{{ lipsum.__globals__['os'].system('true') }}",
    ],
)
def test_templates_cannot_reach_python_internals(source):
    with pytest.raises(TemplateError) as err:
        _render(source)
    assert str(err.value).startswith("chat template t failed: SecurityError: ")


def test_undefined_use_and_type_errors_are_template_errors():
    with pytest.raises(TemplateError) as err:
        _render("{{ nothing.there }}")
    assert str(err.value) == "chat template t failed: UndefinedError: 'nothing' is undefined"
    with pytest.raises(TemplateError) as err:
        _render("{{ 'a' + 1 }}")
    assert str(err.value).startswith("chat template t failed: TypeError: ")


def test_syntax_error_is_reported_with_its_line():
    with pytest.raises(TemplateError) as err:
        ChatTemplate("ok\n{% if x %}never closed", name="bad")
    assert str(err.value) == (
        "chat template bad does not compile: line 2: Unexpected end of template. Jinja was looking for "
        "the following tags: 'elif' or 'else' or 'endif'. The innermost block that needs to be closed is 'if'."
    )


@pytest.mark.parametrize(
    "messages, message",
    [
        ("hi", "chat template t: messages must be a list, got str"),
        ([["user", "hi"]], "chat template t: messages[0] must be an object, got list"),
        ([{"content": "hi"}], "chat template t: messages[0] has no string 'role'"),
        ([{"role": "user", "content": object()}], "chat template t: messages[0].content has a value of unsupported type object"),
    ],
)
def test_bad_message_shapes(messages, message):
    with pytest.raises(TemplateError) as err:
        ChatTemplate("{{ messages }}", name="t").render(messages)
    assert str(err.value) == message


def test_bad_tools_shape():
    with pytest.raises(TemplateError) as err:
        ChatTemplate("x", name="t").render([], tools=["bash"])
    assert str(err.value) == "chat template t: tools[0] must be an object, got str"


def test_for_model_prefers_the_checkpoint_template():
    tpl = ChatTemplate.for_model("CKPT {{ messages|length }}", "qwen3_moe")
    assert tpl.name == "checkpoint"
    assert tpl.render([{"role": "user", "content": "x"}]) == "CKPT 1"
    fallback = ChatTemplate.for_model("", "qwen3_moe")
    assert fallback.name == "qwen3_moe"
    assert fallback.source == (paths.TEMPLATES_DIR / "qwen3_moe.jinja").read_text(encoding="utf-8")


def test_for_model_unknown_type_is_a_value_error():
    with pytest.raises(ValueError) as err:
        ChatTemplate.for_model(None, "llama")
    assert str(err.value) == (
        "no chat template for model_type 'llama': the checkpoint has none and templates/llama.jinja "
        "does not exist (available: glm4_moe, gpt_oss, qwen3_5_moe, qwen3_moe, qwen3_next)"
    )
    with pytest.raises(ValueError) as err:
        ChatTemplate.for_model(None, "../qwen3_moe")
    assert str(err.value) == "invalid model_type '../qwen3_moe' for a chat template"
