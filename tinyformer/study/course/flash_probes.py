"""What the values of exercises 7 and 8 cannot show: how much memory the reader's tiles take, how
many tiles they compute for nothing, and what their backward reads.

* ``peak_memory``: the reader's function at ``MEMORY_LENGTH`` tokens under ``tracemalloc`` (NumPy
  reports its buffers to it), the peak reset at every line of the reader's file (``sys.settrace``),
  so that the line whose execution took the most memory above what was held when it began is
  named; an S or P of the whole length (3,072 × 3,072 float64: 72 MiB) shows on the line that
  makes it.
* ``score_tiles``: q and k handed over as a NumPy subclass that remembers which of their rows every
  array derived from them comes from; each product of a q-only operand with a k-only one (S = Q Kᵀ
  of a tile) is recorded with its query and key rows, so that tiles wholly above the causal
  diagonal, computed and thrown away, can be counted.
"""

import linecache
import sys
import tracemalloc

import numpy

__all__ = ["MEMORY_LENGTH", "peak_memory", "score_tiles", "wasted"]

MEMORY_LENGTH = 3072  # S × S in float64 is 72 MiB: at least 64 MiB, as the issue asks


def peak_memory(call, path):
    """(bytes, line, source) of the line of the reader's file ``path`` whose execution took the
    most memory at once above what was held when it began (line None when outside the file)."""
    filename = str(path)
    state = {"line": None, "worst": (0, None), "held": 0}
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    tracemalloc.reset_peak()
    state["held"] = tracemalloc.get_traced_memory()[0]

    def note():
        """What the line just run took above what was held when it began; the peak reset."""
        current, peak = tracemalloc.get_traced_memory()
        if peak - state["held"] > state["worst"][0]:
            state["worst"] = (peak - state["held"], state["line"])
        tracemalloc.reset_peak()
        state["held"] = current

    def local(frame, event, arg):
        note()
        if event == "line":
            state["line"] = frame.f_lineno
        elif event == "return":
            caller = frame.f_back
            state["line"] = caller.f_lineno if caller and caller.f_code.co_filename == filename else None
        return local

    def calls(frame, event, arg):
        if frame.f_code.co_filename != filename:
            return None
        note()
        state["line"] = frame.f_lineno
        return local

    previous = sys.gettrace()
    sys.settrace(calls)
    try:
        call()
    finally:
        sys.settrace(previous)
        note()
        if started:
            tracemalloc.stop()
    size, line = state["worst"]
    linecache.checkcache(filename)  # the file as it is now, not as an earlier check read it
    return size, line, (linecache.getline(filename, line).strip() if line else "")


class _Rows(numpy.ndarray):
    """An array that knows which rows of the watched q and k it comes from (``_spans``)."""

    def __array_finalize__(self, parent):
        self.derived = getattr(parent, "derived", None)

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        spans, inputs = _unwrap(inputs)
        if "out" in kwargs:
            kwargs["out"] = tuple(_unwrap(kwargs["out"])[1])
        if ufunc is numpy.matmul and method == "__call__":
            _note(spans[0], spans[1])
        return _wrap(getattr(ufunc, method)(*inputs, **kwargs), _merged(spans))

    def __array_function__(self, func, types, args, kwargs):
        spans, args = _unwrap(args)
        _, kwargs = _unwrap(kwargs)
        watched = [s for s in spans if s]
        if func in (numpy.dot, numpy.inner, numpy.tensordot, numpy.einsum) and len(watched) == 2:
            _note(*watched)
        return _wrap(func(*args, **kwargs), _merged(spans))


_WATCHED = {}  # name -> (the watched array's buffer start, end, item size, head dim, length)
_PRODUCTS = []  # (query rows (lo, hi), key rows (lo, hi)) of every score tile computed


def _span(a):
    """{name: (first row, one past the last)} of the watched rows ``a`` holds or comes from."""
    if not isinstance(a, numpy.ndarray):
        return {}
    start = a.__array_interface__["data"][0]
    for name, (lo, hi, item, dim, length) in _WATCHED.items():
        if lo <= start < hi:
            low = start + sum(min(0, (n - 1) * s) for n, s in zip(a.shape, a.strides))
            high = start + sum(max(0, (n - 1) * s) for n, s in zip(a.shape, a.strides))
            return {name: (((low - lo) // item // dim) % length, ((high - lo) // item // dim) % length + 1)}
    return dict(getattr(a, "derived", None) or {})


def _unwrap(values):
    """(the spans of each value, the values as plain arrays), through lists, tuples and dicts."""
    if isinstance(values, dict):
        spans, plain = _unwrap(list(values.values()))
        return spans, dict(zip(values, plain))
    spans, plain = [], []
    for value in values:
        if isinstance(value, (list, tuple)):
            inner, unwrapped = _unwrap(value)
            spans.append(_merged(inner))
            plain.append(type(value)(unwrapped))
        else:
            spans.append(_span(value))
            plain.append(value.view(numpy.ndarray) if isinstance(value, _Rows) else value)
    return spans, plain


def _merged(spans):
    merged = {}
    for span in spans:
        merged.update(span)
    return merged


def _wrap(result, spans):
    if isinstance(result, tuple):
        return tuple(_wrap(r, spans) for r in result)
    if isinstance(result, numpy.ndarray) and result.ndim and spans:
        result = result.view(_Rows)
        result.derived = spans
    return result


def _note(left, right):
    """A product of an operand from q's rows alone with one from k's rows alone: a tile of S."""
    for a, b in ((left, right), (right, left)):
        if set(a) == {"q"} and set(b) == {"k"}:
            _PRODUCTS.append((a["q"], b["k"]))


def score_tiles(call, q, k):
    """The (query rows, key rows) of every tile of S = Q Kᵀ that ``call(q, k)`` computes, q and k
    being (batch, len, d) float64 arrays handed over watched."""
    _WATCHED.clear()
    _PRODUCTS.clear()
    watched = []
    for name, array in (("q", q), ("k", k)):
        array = numpy.ascontiguousarray(array, dtype=numpy.float64)
        start = array.__array_interface__["data"][0]
        _WATCHED[name] = (start, start + max(array.nbytes, 1), array.itemsize, array.shape[-1], array.shape[-2])
        watched.append(array.view(_Rows))
    try:
        call(*watched)
        return list(_PRODUCTS)
    finally:
        _WATCHED.clear()
        _PRODUCTS.clear()


def wasted(tiles, len_q, len_k):
    """The tiles of ``tiles`` whose every key is hidden from every query by the causal mask."""
    return [(rows, keys) for rows, keys in tiles if keys[0] > rows[1] - 1 + (len_k - len_q)]
