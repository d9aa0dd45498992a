"""Chat-template rendering (sandboxed jinja2)."""
