"""How a node process's C heap keeps freed memory: set at its start, and set again where
TensorFlow changes it.

A node receives megabytes per frame and TF copies them into tensors; with glibc's defaults
every such buffer is a fresh mmap or trimmed heap, so a node spent more time in page faults
(zeroing new pages) than in moving data. :func:`tune` keeps freed memory for reuse instead.

TensorFlow's ``from_generator`` (which ``DataFeed.dataset()`` uses) sets ``M_TRIM_THRESHOLD``
to 128 KiB the first time one is iterated in a process ("Memory patch applied: M_TRIM_THRESHOLD
=128 kb was set", TF's ``generator_dataset_op.cc``: its fix for a generator's memory growth in
long-lived servers). ``dataset()`` sets duotf's values again right after, once a process: see
``benchmarks/feed.py --malloc`` for what each setting costs. ``DUOTF_MALLOC=tf`` keeps TF's.
"""

from __future__ import annotations

import os

__all__ = ["tune", "retune_after_tf"]

_retuned = False


def tune() -> bool:
    """Keep freed memory for reuse: mmap only above 32 MiB (glibc's maximum), no trimming
    below 256 MiB of free heap, 64 MiB of top pad. Process-wide; meant for node processes. A
    no-op (False) where the C library is not glibc."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_top_pad, m_mmap_threshold = -1, -2, -3
    return bool(mallopt(m_mmap_threshold, 32 << 20)
                and mallopt(m_trim_threshold, 256 << 20)
                and mallopt(m_top_pad, 64 << 20))


def retune_after_tf() -> None:
    """Set duotf's values again after TF's ``from_generator`` set its own (once a process),
    unless ``DUOTF_MALLOC=tf``."""
    global _retuned
    if not _retuned:
        _retuned = True
        if os.environ.get("DUOTF_MALLOC", "duotf") != "tf":
            tune()
