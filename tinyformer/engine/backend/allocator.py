"""The C library's allocator tuned for training on the CPU: freed memory kept for the next step."""

_memory_kept = None


def keep_freed_memory():
    """Let freed memory stay in the process for the next allocation (glibc's ``mallopt``: no
    ``mmap`` for large blocks, no trimming), as a caching allocator does; returns whether it holds.

    A training step frees and allocates the same large arrays every step (logits, activations,
    masks). By default glibc maps each block above its mmap threshold (128 KiB at first, rising to
    at most 32 MiB) anew and unmaps it when freed, so every step pays a page fault for each page it
    touches and the kernel clears them; kept, the next step reuses them. The process's memory is
    then the high-water mark of one step, held until it ends. Once per process; False where the C
    library is not glibc (macOS, musl).
    """
    global _memory_kept
    if _memory_kept is None:
        _memory_kept = False
        try:
            import ctypes

            mallopt = ctypes.CDLL(None).mallopt
        except (OSError, AttributeError, TypeError):  # no mallopt in this C library (TypeError: Windows)
            return False
        m_trim_threshold, m_mmap_max = -1, -4  # glibc's malloc.h
        _memory_kept = bool(mallopt(m_mmap_max, 0)) and bool(mallopt(m_trim_threshold, 2 ** 31 - 1))
    return _memory_kept
