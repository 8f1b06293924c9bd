"""The explain page's arrays, stored compactly, and what the page computes again from them.

A page holds only what cannot be recomputed: P, Q, K, V and dO of every head (dO = ∂L/∂O, the
gradient at the head's output O = P·V) and each target token's own dℓₜ/dP. The page derives the
rest as the backward of attention does (``recompute``, which mirrors the page's
``explain_numbers.js`` and ``explain_arrays.js`` line for line): dP = dO·Vᵀ,
dS = P∘(dP − rowsum(P∘dP)) (centred, see ``softmax_backward``), dQ = dS·K/√d_k, dK = dSᵀ·Q/√d_k,
dV = Pᵀ·dO, and each token's dℓₜ/dS from its dℓₜ/dP.

Three encodings, each stated with its error bound (``storage_error``), their bytes split into
planes, deflated and in base64 (``_packed``):

- ``float32``: little-endian float32, for the small arrays (saliency, sensitivity, rollout);
- ``float16``: float16 scaled by a power of two per block (a layer's head: its largest |x| below
  1, so nothing overflows and small heads keep their digits); error at most half a float16 unit
  in the last place of the stored value, 2⁻¹¹ of it (2⁻²⁵ of the block's scale below the normal
  range). With ``causal``, only each block's lower triangle (the decoder's P above its diagonal
  is 0);
- ``log8``: one byte a value, the sign and log₂|x| in eighths of an octave below a power of two
  per block (a token's head); error at most 2^(1/16) − 1 = 4.4 % of the stored value, and values
  below 2^-15.8125 of the block's scale stored as 0. With ``causal``, a token's block holds only
  the query rows up to its own position (the later rows cannot reach its loss: they are 0).
"""

import base64
import zlib

import numpy

__all__ = ["encode_float32", "encode_float16", "encode_log8", "decode_array", "storage_error",
           "softmax_backward", "normalised_rows", "backward_formulas", "recompute", "LOG8_STEPS", "LOG8_LEVELS"]

LOG8_STEPS = 8
"""log8 levels per octave."""
LOG8_LEVELS = 127
"""Codes 1..127 are magnitudes 2^-(k-1)/8 of the block's scale, +128 negative, 0 is zero."""


def softmax_backward(probs, grad_probs):
    """dL/dS = P∘(dP − rowsum(P∘dP)) over the last axis: the backward of P = softmax(S).

    Each row is computed from D = dP − dP_im, dP centred at the row's most probable key m: as
    Σ_j P_ij = 1, P∘(D − rowsum(P∘D)) is the same dL/dS, but D_im = 0 and every other term of
    rowsum(P∘D) is as small as its P_ik, so nothing of the size of dP cancels. Written as above,
    a saturated row (P_im = 1 to float64) would get round-off of about 2⁻⁵³·|dP| instead of its
    true values of about P_ik·|dP_ij − dP_im| (10⁻²⁰ and less in a trained model), and rows
    that sum to 0 only to that round-off; centred, they sum to 0 to a few float64 units of their
    own terms, and a row with one visible key (P_im = 1, the others 0) is exactly 0.
    """
    centre = numpy.take_along_axis(grad_probs, numpy.argmax(probs, axis=-1)[..., None], axis=-1)
    centred = grad_probs - centre
    return probs * (centred - numpy.sum(probs * centred, axis=-1, keepdims=True))


def _packed(array, dtype):
    """{"deflate": bytes a value, "base64": ...}: the little-endian bytes of ``array`` as ``dtype``,
    split into byte planes (every value's first byte, then every second byte, ...: the planes of
    signs and exponents repeat, and compress), deflated (raw DEFLATE, which the page's script
    inflates itself) and in base64."""
    values = numpy.ascontiguousarray(array, dtype=dtype)
    width = values.dtype.itemsize
    planes = values.view(numpy.uint8).reshape(-1, width).T.tobytes()
    packer = zlib.compressobj(9, zlib.DEFLATED, -15)
    return {"deflate": width, "bytes": len(planes),
            "base64": base64.b64encode(packer.compress(planes) + packer.flush()).decode()}


def _unpacked(entry):
    """The little-endian bytes ``_packed`` took."""
    planes = numpy.frombuffer(zlib.decompress(base64.b64decode(entry["base64"]), -15), dtype=numpy.uint8)
    return planes.reshape(entry["deflate"], -1).T.tobytes()


def encode_float32(array):
    """A JSON-ready float32 array: shape, encoding and its little-endian bytes in base64."""
    array = numpy.asarray(array)
    return {"shape": list(array.shape), "encoding": "float32", **_packed(array, "<f4")}


def _block_exponents(blocks):
    """Per block (rows of ``blocks``), the least power-of-two exponent e with every |x| < 2^e (0 for zeros)."""
    top = numpy.max(numpy.abs(blocks), axis=-1) if blocks.shape[-1] else numpy.zeros(blocks.shape[:-1])
    return numpy.where(top > 0, numpy.frexp(top)[1], 0).astype(numpy.int64)


def _lower(shape):
    """The flat indices of the lower triangle (diagonal included) of the last two axes' square."""
    return numpy.flatnonzero(numpy.tril(numpy.ones(shape[-2:], dtype=bool)))


def encode_float16(array, block_axes=2, causal=False):
    """``array`` as float16 scaled per block: a block is one index of its first ``block_axes`` axes.
    With ``causal``, only the lower triangle of each (n, n) block is stored (the rest must be 0)."""
    array = numpy.asarray(array, dtype=numpy.float64)
    blocks = array.reshape(array.shape[:block_axes] + (-1,))
    if causal:
        lower = _lower(array.shape)
        if numpy.delete(blocks, lower, axis=-1).any():
            raise ValueError("encode_float16: causal blocks have values above the diagonal")
        blocks = blocks[..., lower]
    exponents = _block_exponents(blocks)
    scaled = numpy.ldexp(blocks, -exponents[..., None])
    return {"shape": list(array.shape), "encoding": "float16", "block_axes": block_axes, "causal": causal,
            "exponents": exponents.ravel().tolist(), **_packed(scaled, "<f2")}


def _log8_codes(values, exponent):
    magnitude = numpy.abs(numpy.ldexp(values, -exponent))  # below 1
    with numpy.errstate(divide="ignore"):
        level = 1 + numpy.rint(-LOG8_STEPS * numpy.log2(magnitude))
    codes = numpy.where((magnitude > 0) & (level <= LOG8_LEVELS), level, 0).astype(numpy.uint8)
    return codes + numpy.where((values < 0) & (codes > 0), 128, 0).astype(numpy.uint8)


def encode_log8(array, causal_positions=None):
    """(tokens, layers, heads, rows, cols) per-token gradients in one byte each, one scale per
    (token, layer, head). With ``causal_positions`` (each token's target position, from 0), a
    token's blocks keep rows 0 to its position only, where every later row is 0 (as the decoder's
    are, unless a backward hook made them otherwise: then all rows are kept)."""
    array = numpy.asarray(array, dtype=numpy.float64)
    if causal_positions is not None and any(token[:, :, p + 1:].any() for token, p in zip(array, causal_positions)):
        causal_positions = None
    pieces, exponents = [], []
    for t, token in enumerate(array):
        kept = token if causal_positions is None else token[:, :, :causal_positions[t] + 1]
        for block in kept.reshape(-1, *kept.shape[-2:]):
            exponent = int(_block_exponents(block.reshape(1, -1))[0])
            exponents.append(exponent)
            pieces.append(_log8_codes(block.ravel(), exponent))
    codes = numpy.concatenate(pieces) if pieces else numpy.zeros(0, dtype=numpy.uint8)
    return {"shape": list(array.shape), "encoding": "log8", "steps": LOG8_STEPS,
            "causal": causal_positions is not None, "exponents": exponents, **_packed(codes, numpy.uint8)}


def _log8_blocks(entry, positions):
    """Yields (token, slice of rows kept) per block in storage order."""
    tokens, layers, heads, rows, _ = entry["shape"]
    for t in range(tokens):
        kept = positions[t] + 1 if entry["causal"] else rows
        for _ in range(layers * heads):
            yield t, kept


def decode_array(entry, positions=None):
    """The float64 array an entry stores, as the page reads it (``positions``: the token
    positions from 0 of a causal log8 entry, ``token_gradients.positions`` − 1)."""
    raw = _unpacked(entry)
    shape = entry["shape"]
    if entry["encoding"] == "float32":
        return numpy.frombuffer(raw, dtype="<f4").astype(numpy.float64).reshape(shape)
    if entry["encoding"] == "float16":
        halves = numpy.frombuffer(raw, dtype="<f2").astype(numpy.float64)
        blocks = numpy.ldexp(halves.reshape(len(entry["exponents"]), -1), numpy.array(entry["exponents"])[:, None])
        if entry.get("causal"):
            full = numpy.zeros((len(blocks), shape[-2] * shape[-1]))
            full[:, _lower(shape)] = blocks
            blocks = full
        return blocks.reshape(shape)
    if entry["encoding"] == "log8":
        codes = numpy.frombuffer(raw, dtype=numpy.uint8)
        out = numpy.zeros(shape)
        blocks = out.reshape(shape[0], -1, *shape[-2:])
        offset = 0
        for index, (t, kept) in enumerate(_log8_blocks(entry, positions)):
            size = kept * shape[-1]
            block = codes[offset:offset + size].astype(numpy.int64)
            offset += size
            level = block & 127
            values = numpy.where(level > 0, numpy.exp2(-(level - 1) / entry["steps"]), 0.0)
            values = numpy.where(block >= 128, -values, values)
            blocks[t, index % blocks.shape[1], :kept] = numpy.ldexp(values, entry["exponents"][index]).reshape(kept, -1)
        return out
    raise ValueError(f"unknown array encoding {entry['encoding']!r}")


def storage_error(entry, stored, positions=None):
    """The largest |x − stored| the encoding allows per entry, for ``stored`` = ``decode_array(entry)``."""
    shape = entry["shape"]
    if entry["encoding"] == "float32":
        return numpy.maximum(numpy.abs(stored) * 2.0 ** -23, 2.0 ** -150)
    if entry["encoding"] == "float16":
        scale = numpy.exp2(numpy.array(entry["exponents"], dtype=numpy.float64))
        scaled = numpy.abs(stored).reshape(len(scale), -1) / scale[:, None]
        _, exponent = numpy.frexp(scaled)  # scaled = m·2^exponent, m in [0.5, 1)
        half_ulp = numpy.where(scaled > 0, numpy.maximum(numpy.exp2(exponent - 12.0), 2.0 ** -25), 2.0 ** -25)
        error = half_ulp * scale[:, None]
        if entry.get("causal"):  # above the diagonal: not stored, exactly 0
            error = numpy.where(numpy.tril(numpy.ones(shape[-2:], dtype=bool)).ravel(), error, 0.0)
        return error.reshape(shape)
    if entry["encoding"] == "log8":
        floor = numpy.zeros(shape)
        blocks = floor.reshape(shape[0], -1, *shape[-2:])
        for index, (t, kept) in enumerate(_log8_blocks(entry, positions)):
            blocks[t, index % blocks.shape[1], :kept] = 2.0 ** (entry["exponents"][index] - (LOG8_LEVELS - 0.5) / 8)
        return numpy.where(stored != 0, numpy.abs(stored) * (2 ** (0.5 / entry["steps"]) - 1), floor)
    raise ValueError(f"unknown array encoding {entry['encoding']!r}")


def normalised_rows(probs):
    """P with each row divided by its sum: the stored P, whose rows sum to 1 only to float16. The
    sum runs left to right, as the page's does (so both get the same numbers to the last bit)."""
    sums = numpy.cumsum(probs, axis=-1)[..., -1:]
    return probs / numpy.where(sums > 0, sums, 1.0)


def backward_formulas(probs, values, d_out, queries=None, keys=None):
    """Attention's backward from P, V, dO (and Q, K where given), arrays (..., rows, cols) and
    (..., n, d_k), as the page computes it: dP = dO·Vᵀ, dS (``softmax_backward``), dV = Pᵀ·dO,
    dQ = dS·K/√d_k, dK = dSᵀ·Q/√d_k."""
    d_probs = d_out @ numpy.swapaxes(values, -1, -2)
    d_scores = softmax_backward(probs, d_probs)
    out = {"dP": d_probs, "dS": d_scores, "dV": numpy.swapaxes(probs, -1, -2) @ d_out}
    if queries is not None:
        scale = 1.0 / numpy.sqrt(queries.shape[-1])
        out["dQ"] = d_scores @ keys * scale
        out["dK"] = numpy.swapaxes(d_scores, -1, -2) @ queries * scale
    return out


def recompute(data):
    """{name: float64 array} of everything the page derives from ``data`` (``explain_data``'s dict)
    besides what it stores: ``dP``, ``dS``, ``dQ``, ``dK``, ``dV`` per kind (``"dS.enc"``, ...) and
    ``token.dS.<kind>``, with ``P.<kind>`` as the page uses it (rows normalised) and
    ``token.dP.<kind>`` decoded."""
    arrays, positions = data["arrays"], [p - 1 for p in data["token_gradients"]["positions"]]
    out = {}
    for kind in data["kinds"]:
        probs = normalised_rows(decode_array(arrays[f"P.{kind}"]))
        q, k, v, d_out = (decode_array(arrays[f"{name}.{kind}"]) for name in ("Q", "K", "V", "dO"))
        token_d_probs = decode_array(arrays[f"token.dP.{kind}"], positions)
        formulas = backward_formulas(probs, v, d_out, q, k)
        out.update({f"{name}.{kind}": value for name, value in formulas.items()})
        out.update({f"P.{kind}": probs, f"token.dP.{kind}": token_d_probs,
                    f"token.dS.{kind}": softmax_backward(numpy.broadcast_to(probs, token_d_probs.shape),
                                                         token_d_probs)})
    return out
