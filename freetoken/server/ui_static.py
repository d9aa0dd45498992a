"""The ``/ui`` page's static files, mounted by the loaded app and by the loading server alike
(this module imports no engine code, so the loading server starts without torch)."""

from __future__ import annotations

from pathlib import Path

from starlette.applications import Starlette
from starlette.staticfiles import StaticFiles

UI_DIR = Path(__file__).with_name("ui")
"""The page's static files (``index.html``, ``style.css``, ``charts.js``, ``api.js``, ``chat.js``,
``app.js``; ``screenshot.png`` is the README's, not in the wheel)."""


def mount_ui(app: Starlette) -> None:
    """Serve ``UI_DIR`` at ``/ui/`` (``index.html`` for the folder itself)."""
    app.mount("/ui", StaticFiles(directory=UI_DIR, html=True), name="ui")
