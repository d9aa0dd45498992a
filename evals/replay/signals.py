"""SIGTERM as Ctrl-C: a run stopped by ``timeout``, a CI job's cancel or ``kill`` takes the same
clean path as one stopped with Ctrl-C (the finished turns are summarised and plotted, the summary
says ``"interrupted": true``), and the command exits 143 (128 + 15) instead of 130.

How: while :class:`Interrupts` is active, the SIGTERM handler records the signal and calls
whatever handles SIGINT at that moment: ``signal.default_int_handler`` (raises
KeyboardInterrupt) outside an event loop, or the handler ``asyncio.run`` installs while the
replay runs (it cancels the main task, and ``asyncio.run`` then raises KeyboardInterrupt). So
both signals reach the same ``except KeyboardInterrupt`` in :func:`evals.replay.app.run_workload`.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

EXIT_SIGINT = 130  # 128 + SIGINT (2)
EXIT_SIGTERM = 143  # 128 + SIGTERM (15)


class Interrupts:
    """Context manager that routes SIGTERM to the SIGINT path and remembers which one came.

    ``with Interrupts() as intr: ...``; afterwards ``intr.terminated`` tells SIGTERM from Ctrl-C,
    :meth:`exit_status` is 143 or 130 and :meth:`cause` ``"SIGTERM"`` or ``"Ctrl-C"``. Outside the
    main thread (where no handler can be installed) it does nothing. The previous SIGTERM handler
    is restored on exit.
    """

    def __init__(self) -> None:
        self.terminated = False
        self._previous: object = None
        self._installed = False

    def __enter__(self) -> Interrupts:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)
            self._installed = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._installed:
            signal.signal(signal.SIGTERM, self._previous)  # type: ignore[arg-type]
            self._installed = False

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        self.terminated = True
        handler = signal.getsignal(signal.SIGINT)
        if callable(handler):
            handler(signal.SIGINT, frame)
        else:  # SIGINT ignored or default: still stop the run the Ctrl-C way
            raise KeyboardInterrupt

    def cause(self) -> str:
        """``"SIGTERM"`` when a SIGTERM came, else ``"Ctrl-C"`` (SIGINT)."""
        return "SIGTERM" if self.terminated else "Ctrl-C"

    def exit_status(self) -> int:
        """143 after a SIGTERM, else 130."""
        return EXIT_SIGTERM if self.terminated else EXIT_SIGINT
