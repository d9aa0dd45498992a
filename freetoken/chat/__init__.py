"""Chat-template rendering (sandboxed jinja2)."""

from freetoken.chat.template import ChatTemplate, TemplateError

__all__ = ["ChatTemplate", "TemplateError"]
