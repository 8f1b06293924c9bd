"""From the reader's loop to tinyformer's CUDA kernel: the same recurrence, line by line, and traced.

``kernel_lines(number)``: the lines of kernels/attention.cu (CUDA cores, float32) and
attention_mma.cu (tensor cores) that compute each step of exercise 7's recurrence (the running
max, the correction exp(m − m_new), l, acc, O and lse) or exercise 8's (D, P = exp(S − lse), dS,
dV, dK, dQ, the first query tile), found in the source by their text, with their line numbers.

``trace(module, q, k, v, key_lengths, causal)``: the running max and sum of every query row after
every key tile of ``KEY_TILE`` keys, three times: from the emulated kernel (attention.cu's forward
built for the CPU, where TF_ATTENTION_TRACE records into a buffer; kernels/attention.cuh), from the
reader's forward (its ``record`` calls, with ``block = KEY_TILE``) and from the reference recurrence
(``flash_reference.tiled_forward``); plus each one's lse. The CPU build of the kernel is
``tinyformer.testing.emulation``: the one use of the verification package in the study layer
(tests/project/test_imports.py allows it here and in ``cli/gradcheck.py`` only).
"""

import ctypes

import numpy

from ...engine.kernels import attention as attention_kernel, launch, registry
from .flash_reference import running_state, tiled_forward

__all__ = ["KEY_TILE", "STEPS", "kernel_lines", "step_lines", "trace", "trace_lines", "Trace"]

KEY_TILE = registry.ATTENTION_KEY_TILE  # keys per tile of attention.cu's forward: one per lane (32)

STEPS = {  # exercise -> [(the step, source file, a text found once on its line)]
    7: [("m_new = max(m, rowmax(S_t))", "attention.cu", "const float new_max = fmaxf(row_max[r], tf::warp_max(s));"),
        ("P_t = exp(S_t − m_new)", "attention.cu", "const float p = visible ? expf(s - new_max) : 0.0f;"),
        ("exp(m − m_new), the correction", "attention.cu", "const float correction = expf(row_max[r] - new_max);"),
        ("l = l·exp(m − m_new) + rowsum(P_t)", "attention.cu", "row_sum[r] = row_sum[r] * correction + tf::warp_sum(p);"),
        ("acc = acc·exp(m − m_new)", "attention.cu", "for (int c = 0; c < S::kCols; ++c) acc[r][c] *= correction;"),
        ("acc += P_t V_t", "attention.cu", "acc[r][c] += weight * v_tile[src][lane + kWarp * c];"),
        ("O = acc / l (0 for a row that saw no key)", "attention.cu", "const float inv = row_sum[r] > 0.0f ?"),
        ("lse = m + log l", "attention.cu", "? row_max[r] + logf(row_sum[r]) : -TF_INFINITY;"),
        ("the last key the block sees", "attention.cu", "const int key_end = P.key_end(bh, first_row, S::kBlockRows);"),
        ("m_new, on tensor cores (base 2)", "attention_mma.cu", "const float new_max = fmaxf(row_max[half], quad_max("),
        ("the correction, on tensor cores", "attention_mma.cu", "const float correction = exp2f(row_max[half] - base);"),
        ("l, on tensor cores", "attention_mma.cu", "row_sum[half] = row_sum[half] * correction + sum;")],
    8: [("D = rowsum(dO ∘ O)", "attention.cu", "s += tf::to_float(o[row * D + c]) * tf::to_float(grad_o[row * D + c]);"),
        ("P = exp(S − lse)", "attention.cu", "p = expf(dot_shared<D>(q_tile[lane], k_rows[local]) * scale - lse_tile[lane]);"),
        ("dP = dO·Vᵀ", "attention.cu", "const float dp = dot_shared<D>(go_tile[lane], v_rows[local]) * z;"),
        ("dS = P ∘ (dP − D)", "attention.cu", "ds = p * (dp - delta_tile[lane]);"),
        ("dV += Pᵀ·dO", "attention.cu", "dv[r][c] += p_src * go_tile[src][lane + kWarp * c];"),
        ("dK += dSᵀ·Q (× scale at the end)", "attention.cu", "dk[r][c] += ds_src * q_tile[src][lane + kWarp * c];"),
        ("dQ += dS·K (its own kernel)", "attention.cu", "dq[r][c] += ds_src * k_tile[src][lane + kWarp * c];"),
        ("the first query tile that sees the keys", "attention.cu", "const int query_start = causal ?"),
        ("P = exp(S − lse), on tensor cores", "attention_mma.cu", "p = exp2f(st[n][c] * scale_log2 - lse_s[local]);"),
        ("dS, on tensor cores", "attention_mma.cu", "ds = p * (dpt[n][c] * z - delta_s[local]);")],
}


def kernel_lines(number):
    """[(step, file, line number or None when the text is no longer there, the line's text)] of
    exercise ``number``'s recurrence (a text on several lines: its first, the forward's)."""
    found = []
    sources = {}
    for step, filename, text in STEPS[number]:
        if filename not in sources:
            sources[filename] = (registry.KERNEL_DIR / filename).read_text(encoding="utf-8").splitlines()
        hits = [i for i, line in enumerate(sources[filename]) if text in line]  # the first: the forward's
        line = hits[0] + 1 if hits else None
        found.append((step, filename, line, sources[filename][hits[0]].strip() if line else text))
    return found


class Trace:
    """Running max and sum (batch, len_q, tiles) after every key tile, and lse (batch, len_q), of
    the kernel, the reader's forward and the reference recurrence."""

    def __init__(self, kernel, yours, reference, tiles):
        self.kernel, self.yours, self.reference, self.tiles = kernel, yours, reference, tiles


def _kernel(q, k, v, key_lengths, causal, tiles):
    from ...testing import emulation  # study's one use of the verification room: the kernels' CPU build

    batch, len_q = q.shape[0], q.shape[1]
    library = emulation.library()
    library.tf_attention_trace.argtypes = [ctypes.c_void_p, ctypes.c_longlong]
    library.tf_attention_traced.restype = ctypes.c_longlong
    capacity = batch * (len_q + 64) * tiles
    buffer = numpy.zeros((capacity, 5), dtype=numpy.float32)
    previous = emulation.install()  # attention_forward on NumPy arrays runs through this library
    library.tf_attention_trace(buffer.ctypes.data, capacity)
    try:
        lengths = None if key_lengths is None else numpy.asarray(key_lengths, dtype=numpy.int32)
        o, lse = attention_kernel.attention_forward(*(numpy.ascontiguousarray(a, dtype=numpy.float32)
                                                      for a in (q, k, v)), 1, key_lengths=lengths, causal=causal)
        count = library.tf_attention_traced()
    finally:
        library.tf_attention_trace(None, 0)
        launch.install_host_loader(previous)
    if count > capacity:
        raise RuntimeError(f"the kernel's trace has {count} entries, more than the {capacity} kept")
    entries = [(int(b), int(r), int(t), float(m), float(s)) for b, r, t, m, s in buffer[:count]]
    return (*running_state(entries, batch, len_q, tiles), lse.astype(numpy.float64))


def _yours(module, q, k, v, key_lengths, causal, tiles):
    entries = []

    def record(b, i0, tile, m, l):
        for r, (row_max, row_sum) in enumerate(zip(numpy.ravel(m), numpy.ravel(l))):
            entries.append((int(b), int(i0) + r, int(tile), float(row_max), float(row_sum)))

    original = module.__dict__.get("record")
    module.record = record
    try:
        _, lse = module.forward(q.copy(), k.copy(), v.copy(), key_lengths, causal, KEY_TILE)
    finally:
        module.record = original
    return (*running_state(entries, q.shape[0], q.shape[1], tiles), numpy.asarray(lse, dtype=numpy.float64))


def trace(module, q, k, v, key_lengths=None, causal=False):
    """The ``Trace`` of the input (float64 q, k, v of (batch, len, d), d one of the kernel's head
    dimensions, ``registry.HEAD_DIMS``); the kernel runs in float32, through the CPU emulation."""
    if q.shape[-1] not in registry.HEAD_DIMS:
        raise ValueError(f"trace: the head dimension must be one of the kernel's, {registry.HEAD_DIMS}; got "
                         f"{q.shape[-1]}")
    tiles = -(-k.shape[1] // KEY_TILE)
    reference = []
    _, lse = tiled_forward(q, k, v, key_lengths, causal, KEY_TILE, trace=reference)
    return Trace(_kernel(q, k, v, key_lengths, causal, tiles), _yours(module, q, k, v, key_lengths, causal, tiles),
                 (*running_state(reference, q.shape[0], q.shape[1], tiles), lse), tiles)


def step_lines(number):
    """Exercise ``number``'s recurrence in the kernels' source, as lines to print."""
    lines = []
    for step, filename, line, text in kernel_lines(number):
        where = f"{filename}:{line}" if line else f"{filename} (no longer found)"
        lines.append(f"  {step:<42} {where:<20} {text}")
    return lines


def trace_lines(found, rows=4):
    """The ``Trace`` told: the first ``rows`` query rows of the first sequence, tile by tile, the
    kernel's running max and sum beside the reader's, then each row's lse, then the largest
    differences over every row."""
    (km, kl, klse), (ym, yl, ylse) = found.kernel, found.yours
    lines = [f"  {'row':>4} {'tile':>4} {'keys':>8}   {'max: kernel':>12} {'yours':>12}   {'sum: kernel':>12} "
             f"{'yours':>12}"]
    for row in range(min(rows, km.shape[1])):
        for tile in range(found.tiles):
            keys = f"{tile * KEY_TILE}–{(tile + 1) * KEY_TILE - 1}"
            lines.append(f"  {row:>4} {tile:>4} {keys:>8}   {km[0, row, tile]:>12.6g} {ym[0, row, tile]:>12.6g}   "
                         f"{kl[0, row, tile]:>12.6g} {yl[0, row, tile]:>12.6g}")
        lines.append(f"  {row:>4}  lse = m + log l: kernel {klse[0, row]:.6g}, yours {ylse[0, row]:.6g}")
    if numpy.isnan(ym).all():
        lines.append("  yours: nothing recorded — your forward never calls record(b, i0, j0 // block, m, l)")
        return lines
    lines.append(f"  largest difference over all {km.shape[0] * km.shape[1]} rows and {found.tiles} tiles: running max "
                 f"{_largest(km, ym):.2g}, running sum {_largest(kl, yl, relative=True):.2g} (relative), lse "
                 f"{_largest(klse, ylse):.2g} — the kernel in float32, yours in float64")
    return lines


def _largest(a, b, relative=False):
    """The largest |a − b| (relative to max |b| with ``relative``) where both are finite; inf where
    one is finite and the other not."""
    if not numpy.array_equal(numpy.isfinite(a), numpy.isfinite(b)):
        return numpy.inf
    both = numpy.isfinite(a)
    difference = float(numpy.abs(a[both] - b[both]).max(initial=0.0))
    return difference / max(float(numpy.abs(b[both]).max(initial=0.0)), 1e-30) if relative else difference
