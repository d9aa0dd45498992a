"""The jinja2 sandbox chat templates run in, with the Hugging Face template globals and filters.

Follows the behaviour of ``transformers`` chat templating (``utils/chat_template_utils.py``):
``ImmutableSandboxedEnvironment`` with ``trim_blocks`` and ``lstrip_blocks``, the ``loopcontrols``
extension, a ``{% generation %}`` block tag (rendered as its body), a ``tojson`` filter that does
not HTML-escape (``json.dumps`` with ``ensure_ascii=False`` by default and the ``indent`` /
``separators`` / ``sort_keys`` arguments), and the globals ``raise_exception``, ``strftime_now``,
``namespace`` and ``dict``. The implementation is FreeToken's own.

Hardening beyond jinja's sandbox: an attribute access the sandbox refuses (``''.__class__``)
yields an undefined value that raises ``SecurityError`` as soon as it is printed, iterated or
tested, instead of silently rendering as an empty string; namespaces refuse underscore names.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace


class TemplateRaised(jinja2.exceptions.TemplateError):
    """Raised by the template itself through ``raise_exception(message)``."""


class _SandboxUndefined(jinja2.Undefined):
    """Undefined that turns a refused (unsafe) attribute access into an error when used."""

    __slots__ = ()

    def _refused(self) -> bool:
        return self._undefined_exception is SecurityError

    def __str__(self) -> str:
        if self._refused():
            self._fail_with_undefined_error()
        return super().__str__()

    def __iter__(self):  # type: ignore[override]
        if self._refused():
            self._fail_with_undefined_error()
        return super().__iter__()

    def __bool__(self) -> bool:
        if self._refused():
            self._fail_with_undefined_error()
        return super().__bool__()

    def __len__(self) -> int:
        if self._refused():
            self._fail_with_undefined_error()
        return super().__len__()


class _SafeNamespace(Namespace):
    """``namespace(...)`` that refuses attribute names starting with an underscore."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 - same trick as jinja's Namespace
        self, rest = args[0], args[1:]
        for name in dict(*rest, **kwargs):
            _SafeNamespace._check(name)
        Namespace.__init__(self, *rest, **kwargs)

    def __setitem__(self, name: str, value: Any) -> None:
        _SafeNamespace._check(name)
        Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: object) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise SecurityError(f"namespace attribute {name!r} is not allowed (leading underscore)")


class _GenerationBlock(jinja2.ext.Extension):
    """``{% generation %}…{% endgeneration %}``: HF's assistant-mask marker, rendered as its body."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return caller()


def _raise_exception(message: object) -> None:
    raise TemplateRaised(str(message))


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | str | None = None,
    separators: tuple[str, str] | list[str] | None = None,
    sort_keys: bool = False,
) -> str:
    if separators is not None:
        separators = tuple(separators)  # jinja has no tuple literal syntax in every position
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _plain_dict(*args: Any, **kwargs: Any) -> dict:
    return dict(*args, **kwargs)


def make_environment() -> ImmutableSandboxedEnvironment:
    """Build the sandboxed environment every chat template is compiled in.

    Returns:
        A fresh ``ImmutableSandboxedEnvironment`` (lists/dicts cannot be mutated from a template;
        dunder and internal attributes are refused).
    """
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[jinja2.ext.loopcontrols, _GenerationBlock],
        undefined=_SandboxUndefined,
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["namespace"] = _SafeNamespace
    env.globals["dict"] = _plain_dict
    return env
