"""Progress of a weight load, per stage: bytes done so far, as bars or as log lines.

:func:`~freetoken.models.loader.load_weights` reports a :class:`LoadStep` of stage ``read``
after every tensor; the host expert banks then report their own stages (``quantise``: converted
to a 4-bit format; ``huge pages``: collapsed into 2 MiB pages; ``pin``: page-locked for a CUDA
device) with :func:`report_stage`.
:func:`load_reporter` turns those into ``rich`` progress bars (one per stage: bytes, GB/s, ETA)
on a terminal, or log lines otherwise (logs, CI, a service manager): one per finished shard of
a sharded read, one per finished later stage.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from freetoken.units import format_bytes


@dataclass(frozen=True)
class LoadStep:
    """One tensor read, or the progress of a later stage.

    Attributes:
        done_bytes, total_bytes: stored bytes read so far / to read in all (the tensors the model
            loads; ignored tensors and unread shards do not count); of a later stage, its bytes
            done / in all.
        shard, num_shards: 1-based index of the file being read, and how many files hold loaded
            tensors.
        shard_done: this tensor was the last one read from ``shard``.
        stage: ``read`` (the bytes of the checkpoint), or a later stage over the host expert
            banks' bytes (``quantise``, ``huge pages``, ``pin``), reported as one shard.
    """

    done_bytes: int
    total_bytes: int
    shard: int
    num_shards: int
    shard_done: bool
    stage: str = "read"


LoadProgress = Callable[[LoadStep], None]


def report_stage(progress: LoadProgress | None, stage: str, done: int, total: int) -> None:
    """Report ``done`` of ``total`` bytes of the later load stage ``stage`` (one shard) to
    ``progress``, when there is one."""
    if progress is not None:
        progress(LoadStep(done, total, 1, 1, done == total, stage))


class LoadReporter(Protocol):
    """A :data:`LoadProgress` that is closed once the load is over (a bar is then taken down)."""

    def __call__(self, step: LoadStep) -> None: ...

    def close(self) -> None: ...


def load_reporter(say: Callable[[str], None], terminal: bool,
                  clock: Callable[[], float] = time.perf_counter,
                  console=None) -> LoadReporter:
    """Bars on a terminal (``console``: a ``rich`` console, default stderr's), else
    :class:`LogLines` through ``say``."""
    return StageBars(console) if terminal else LogLines(say, clock)


class LogLines:
    """Log lines of a load: one per finished shard of a sharded read (``read shard 2/5: 1.20
    GiB of 6.00 GiB in 0.5 s, 2.58 GB/s``; one file: the caller's summary says it), one per
    finished later stage (``pin: 4.00 GiB in 0.3 s, 14.32 GB/s``). Seconds count from the
    reporter's creation for ``read``, from a stage's first step for the others."""

    def __init__(self, say: Callable[[str], None],
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self._say, self._clock = say, clock
        self._started = {"read": clock()}

    def __call__(self, step: LoadStep) -> None:
        if step.stage not in self._started:
            self._started[step.stage] = self._clock()
        if not step.shard_done or (step.stage == "read" and step.num_shards == 1):
            return
        seconds = max(self._clock() - self._started[step.stage], 1e-9)
        speed = f"{step.done_bytes / seconds / 1e9:.2f} GB/s"
        if step.stage == "read":
            self._say(f"read shard {step.shard}/{step.num_shards}: "
                      f"{format_bytes(step.done_bytes)} of {format_bytes(step.total_bytes)} in "
                      f"{seconds:.1f} s, {speed}")
        else:
            self._say(f"{step.stage}: {format_bytes(step.done_bytes)} in {seconds:.1f} s, {speed}")

    def close(self) -> None:
        """Nothing to take down."""


class StageBars:
    """``rich`` bars, one per stage as it starts (bytes, GB/s, ETA; the shard of a sharded
    read), taken down by :meth:`close`."""

    def __init__(self, console=None) -> None:
        from rich.console import Console
        from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn,
                                   TimeRemainingColumn, TransferSpeedColumn)

        self._bar = Progress(TextColumn("[freetoken] {task.description:<8}", markup=False),
                             BarColumn(), DownloadColumn(), TransferSpeedColumn(), TextColumn("ETA"),
                             TimeRemainingColumn(), TextColumn("{task.fields[detail]}"),
                             console=console or Console(stderr=True), transient=True)
        self._tasks: dict[str, int] = {}

    def __call__(self, step: LoadStep) -> None:
        if not self._tasks:
            self._bar.start()
        task = self._tasks.get(step.stage)
        if task is None:
            task = self._tasks[step.stage] = self._bar.add_task(
                step.stage, total=step.total_bytes, detail="")
        shard = step.stage == "read" and step.num_shards > 1
        self._bar.update(task, completed=step.done_bytes,
                         detail=f"shard {step.shard}/{step.num_shards}" if shard else "")

    def close(self) -> None:
        """Take the bars down (when any was shown)."""
        if self._tasks:
            self._bar.stop()
