"""Human-readable sizes, shared by the CLI (``freetoken ctl``) and log lines (no heavy imports)."""

from __future__ import annotations


def format_bytes(num_bytes: int) -> str:
    """``num_bytes`` in binary units with two decimals (``1.50 GiB``); below 1 KiB in bytes."""
    if num_bytes < 1024:
        return f"{num_bytes} B"
    value = float(num_bytes)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024 or unit == "TiB":
            break
    return f"{value:.2f} {unit}"
