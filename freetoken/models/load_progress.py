"""Progress of a weight load: bytes read so far, per shard, as a bar or as log lines.

:func:`~freetoken.models.loader.load_weights` reports a :class:`LoadStep` after every tensor;
:func:`load_reporter` turns those into a ``rich`` progress bar (bytes and GB/s) on a terminal,
or one line per finished shard otherwise (logs, CI, a service manager).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from freetoken.units import format_bytes


@dataclass(frozen=True)
class LoadStep:
    """One tensor read.

    Attributes:
        done_bytes, total_bytes: stored bytes read so far / to read in all (the tensors the model
            loads; ignored tensors and unread shards do not count).
        shard, num_shards: 1-based index of the file being read, and how many files hold loaded
            tensors.
        shard_done: this tensor was the last one read from ``shard``.
    """

    done_bytes: int
    total_bytes: int
    shard: int
    num_shards: int
    shard_done: bool


LoadProgress = Callable[[LoadStep], None]


def load_reporter(say: Callable[[str], None], terminal: bool,
                  clock: Callable[[], float] = time.perf_counter) -> LoadProgress:
    """A :data:`LoadProgress` that draws a bar on a terminal, else calls ``say`` once per shard
    of a sharded checkpoint (``read shard 2/5: 1.20 GiB of 6.00 GiB in 0.5 s, 2.58 GB/s``)."""
    if terminal:
        return _bar()
    started = clock()

    def line(step: LoadStep) -> None:
        if not step.shard_done or step.num_shards == 1:  # one file: the caller's summary says it
            return
        seconds = max(clock() - started, 1e-9)
        say(f"read shard {step.shard}/{step.num_shards}: {format_bytes(step.done_bytes)} of "
            f"{format_bytes(step.total_bytes)} in {seconds:.1f} s, "
            f"{step.done_bytes / seconds / 1e9:.2f} GB/s")

    return line


def _bar() -> LoadProgress:
    """A rich bar on stderr (bytes, GB/s, shard), removed when the last shard is read."""
    from rich.console import Console
    from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn,
                               TransferSpeedColumn)

    bar = Progress(TextColumn("[freetoken] weights"), BarColumn(), DownloadColumn(),
                   TransferSpeedColumn(), TextColumn("shard {task.fields[shard]}"),
                   console=Console(stderr=True), transient=True)
    task = None

    def update(step: LoadStep) -> None:
        nonlocal task
        if task is None:
            bar.start()
            task = bar.add_task("weights", total=step.total_bytes, shard="")
        bar.update(task, completed=step.done_bytes, shard=f"{step.shard}/{step.num_shards}")
        if step.shard_done and step.shard == step.num_shards:
            bar.stop()

    return update
