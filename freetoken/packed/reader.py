"""Parallel reads of packed bank chunks into host tensors, with direct I/O where it works.

Every chunk is read by a thread pool straight into its place in the destination tensor: its
page-aligned body with ``O_DIRECT`` (no page-cache copy) when the file offset and the destination
address are both 4 KiB aligned, the rest (and everything on a filesystem that refuses
``O_DIRECT``: ``EINVAL`` at open or at the first read) with buffered ``preadv``. The chunk's CRC-32
is then taken over the destination bytes; ``zlib.crc32`` and ``preadv`` release the GIL, so the
threads overlap. No staging copy of a bank exists.
"""

from __future__ import annotations

import errno
import os
import threading
import zlib
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

import torch

from freetoken.packed.manifest import ALIGN, PackedBank, PackedManifest

DEFAULT_THREADS = 8  # enough requests in flight to keep an NVMe queue busy


@dataclass(frozen=True)
class ChunkRead:
    """One chunk to read.

    Attributes:
        file: the data file; offset: the chunk's first byte in it.
        dest: the ``[length]`` uint8 CPU tensor it is read into (a view of a bank).
        crc32: its stored checksum; bank: the bank's name (for errors).
    """

    file: Path
    offset: int
    dest: torch.Tensor
    crc32: int
    bank: str


def chunk_reads(manifest: PackedManifest, bank: PackedBank, dest: torch.Tensor,
                layers: range) -> list[ChunkRead]:
    """The chunks of ``layers`` of ``bank`` read into ``dest``, the contiguous tensor holding
    exactly those layers' rows (``len(layers) * layer_bytes`` bytes).

    Raises:
        ValueError: ``dest`` is not contiguous or has another byte size.
    """
    per_layer = bank.layer_bytes(manifest.num_layers)
    flat = dest.reshape(-1).view(torch.uint8) if dest.is_contiguous() else None
    if flat is None or flat.numel() != per_layer * len(layers):
        raise ValueError(f"bank {bank.name!r}: destination of {dest.nbytes} bytes "
                         f"(contiguous: {dest.is_contiguous()}) for {len(layers)} layer(s) of "
                         f"{per_layer} bytes")
    base = layers.start * per_layer
    return [ChunkRead(manifest.path / bank.file, bank.offset + start,
                      flat[start - base : start - base + length], crc, bank.name)
            for start, length, crc in bank.chunks(manifest.num_layers, manifest.chunk_bytes,
                                                  layers)]


class ChunkReader:
    """Reads :class:`ChunkRead` lists with ``threads`` threads (files opened once, kept open
    until :meth:`close`).

    Attributes:
        direct_bytes: bytes read with ``O_DIRECT`` so far; buffered_bytes: with buffered reads.
    """

    def __init__(self, threads: int = DEFAULT_THREADS, direct: bool = True) -> None:
        self.threads = max(1, threads)
        self._direct = direct
        self._fds: dict[Path, tuple[int | None, int]] = {}
        self._lock = threading.Lock()
        self.direct_bytes = self.buffered_bytes = 0

    def read(self, reads: list[ChunkRead], progress: Callable[[int], None] | None = None) -> None:
        """Read and verify every chunk; ``progress`` (called on this thread) gets each chunk's
        byte count as it completes and may raise to stop the read.

        Raises:
            ValueError: a chunk ends past the end of its file (truncated) or its checksum does
                not match; the message names the file and the byte offset.
            OSError: a read failed otherwise.
        """
        with ThreadPoolExecutor(self.threads, thread_name_prefix="freetoken-read") as pool:
            pending: set[Future] = {pool.submit(self._read_one, r) for r in reads}
            try:
                while pending:
                    done, pending = wait(pending, return_when=FIRST_EXCEPTION)
                    for future in done:
                        nbytes = future.result()
                        if progress is not None:
                            progress(nbytes)
            except BaseException:
                for future in pending:
                    future.cancel()
                raise

    def close(self) -> None:
        """Close every file opened."""
        for direct, buffered in self._fds.values():
            for fd in (direct, buffered):
                if fd is not None:
                    os.close(fd)
        self._fds.clear()

    def __enter__(self) -> "ChunkReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _open(self, file: Path) -> tuple[int | None, int]:
        with self._lock:
            if file not in self._fds:
                direct = None
                if self._direct and hasattr(os, "O_DIRECT"):
                    try:
                        direct = os.open(file, os.O_RDONLY | os.O_DIRECT)
                    except OSError as exc:  # tmpfs and some FUSE filesystems refuse it
                        if exc.errno != errno.EINVAL:
                            raise
                buffered = os.open(file, os.O_RDONLY)
                self._fds[file] = (direct, buffered)
            return self._fds[file]

    def _no_direct(self, file: Path) -> None:
        """``O_DIRECT`` reads of ``file`` failed with EINVAL: buffered from now on."""
        with self._lock:
            direct, buffered = self._fds[file]
            if direct is not None:
                os.close(direct)
            self._fds[file] = (None, buffered)

    def _read_one(self, r: ChunkRead) -> int:
        direct, buffered = self._open(r.file)
        view = memoryview(r.dest.numpy())
        length, done = len(view), 0
        if direct is not None and r.offset % ALIGN == 0 and r.dest.data_ptr() % ALIGN == 0:
            body = length // ALIGN * ALIGN
            while done < body:
                try:
                    n = os.preadv(direct, [view[done:body]], r.offset + done)
                except OSError as exc:
                    if exc.errno != errno.EINVAL:
                        raise
                    self._no_direct(r.file)
                    break
                done += n
                if n == 0 or n % ALIGN:
                    break
            with self._lock:
                self.direct_bytes += done
        start = done
        while done < length:
            n = os.preadv(buffered, [view[done:]], r.offset + done)
            if n == 0:
                raise ValueError(f"{r.file}: truncated: bank {r.bank!r} chunk at byte offset "
                                 f"{r.offset} needs {length} bytes but the file ends at byte "
                                 f"offset {r.offset + done}")
            done += n
        with self._lock:
            self.buffered_bytes += done - start
        crc = zlib.crc32(view)
        if crc != r.crc32:
            raise ValueError(f"{r.file}: checksum mismatch in bank {r.bank!r}, chunk at byte "
                             f"offset {r.offset} ({length} bytes): crc32 {crc:08x}, manifest says "
                             f"{r.crc32:08x}; the file is corrupt, convert the checkpoint again")
        return length
