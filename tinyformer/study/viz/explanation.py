"""``explain``: one sentence pair's attention and the gradients flowing back through it, computed
in float64 on NumPy, for the offline page of ``explain_page``.

The loss is the sentence's negative log-likelihood L = Σₜ ℓₜ, ℓₜ = −log p(yₜ | y₍<t₎, x) (no
label smoothing), teacher-forced on a reference or on the model's own translation. For every
layer and head of the three kinds of attention it gives P = softmax(QKᵀ/√d_k), dL/dP at the
``keep_attention`` hook point and dL/dS = P∘(dP − rowsum(P∘dP)) (softmax's backward), the same
for each ℓₜ alone (Σₜ dℓₜ/dP = dL/dP, checked), the saliency of every token's embedding, each
head's sensitivity Σ P∘dL/dP, attention rollout, the gradient check of ``explain_check`` and what
the derivation panel shows: Q, K, V, dO, dQ, dK, dV of every head (autograd's) and how far the
formulas dV = Pᵀ·dO, dP = dO·Vᵀ, dQ = dS·K/√d_k, dK = dSᵀ·Q/√d_k are from them.
"""

import numpy

from ...common.version import __version__
from .explain_check import check_gradients
from .explain_codec import (
    backward_formulas,
    decode_array,
    encode_float16,
    encode_float32,
    encode_log8,
    softmax_backward,
)
from .explain_page import render
from .probe import KINDS, attention_modules, probed_copy, run_pass
from .sentence import sentence_pair, special_ids

__all__ = ["SCHEMA", "SCHEMA_VERSION", "TOKEN_VALUES_LIMIT", "explain", "explain_data", "explain_steps",
           "explain_steps_data", "softmax_backward", "rollout", "decode_array", "token_values"]

SCHEMA, SCHEMA_VERSION = "tinyformer-explain", 2
TOKEN_VALUES_LIMIT = 900_000
"""The most per-token dℓₜ/dP numbers a page may hold (one byte each, 1.1 MiB in base64); beyond
it, the page holds the first tokens that fit (``tokens=`` chooses others)."""
CHUNK_VALUES = 1 << 24
"""About how many float64 numbers one batched pass of per-token gradients may hold at once."""
SAMPLES = (8, 16)
"""Per recomputed array, the entries whose float64 values the page's self-test gets: the largest
|value|s and random others."""


def rollout(maps):
    """Attention rollout (Abnar & Zuidema, 2020) of (layers, heads, n, n) probabilities: the product,
    first layer rightmost, of ½·mean over heads + ½·I (the residual stream's share)."""
    result = numpy.eye(maps.shape[-1])
    for layer in maps:
        result = (0.5 * layer.mean(axis=0) + 0.5 * numpy.eye(maps.shape[-1])) @ result
    return result


def token_values(config, len_src, len_tgt, position):
    """How many numbers the page of a model of ``config`` (its TransformerConfig) stores for the target
    position ``position`` (from 0): its dℓₜ/dP of every head, the encoder's whole, the decoder's and
    the cross-attention's rows up to itself."""
    encoder_layers, decoder_layers = config.depths
    return config.heads * (encoder_layers * len_src ** 2 + decoder_layers * (position + 1) * (len_tgt + len_src))


def _chunk_rows(copy, len_src, len_tgt):
    """How many per-token rows one batched pass takes: its attention maps, activations and logits
    stay near ``CHUNK_VALUES`` float64 numbers."""
    c = copy.config
    encoder_layers, decoder_layers = c.depths
    maps = c.heads * (encoder_layers * len_src ** 2 + decoder_layers * 2 * (len_tgt ** 2 + len_tgt * len_src))
    activations = (encoder_layers * len_src + decoder_layers * 2 * len_tgt) * (6 * c.d_model + c.d_ff)
    row = 6 * maps + 4 * activations + 3 * len_tgt * copy.tgt_vocab_size
    return max(1, min(len_tgt, CHUNK_VALUES // row))


def _embedded_positions(tokens, count, cost, limit):
    """The target positions (from 0) whose own dℓₜ/dP the page holds: ``tokens`` (from 1), or the
    first ones whose ``cost(position)`` numbers fit in ``limit``."""
    if tokens is not None:
        positions = sorted({int(t) - 1 for t in tokens})
        bad = [t + 1 for t in positions if not 0 <= t < count]
        if bad:
            raise ValueError(f"tokens {bad}: not target positions; the target has {count} (1 to {count}, the "
                             "last the EOS)")
        return positions
    positions, used = [], 0
    for position in range(count):
        used += cost(position)
        if used > limit:
            break
        positions.append(position)
    return positions


def _samples(values, rng):
    """{"index": flat indices, "value": float64 values} of a few entries of ``values`` (..., rows,
    cols): the largest |value|s and random others of one random head, for the page's self-test to
    compare its recomputation with (a head's bounds are what the page computes to check them)."""
    flat = numpy.asarray(values, dtype=numpy.float64).ravel()
    if not flat.size:
        return {"index": [], "value": []}
    largest, others = SAMPLES
    inner = int(numpy.prod(values.shape[-2:]))
    head = int(rng.integers(flat.size // inner))
    picked = list(numpy.argsort(-numpy.abs(flat), kind="stable")[:largest])
    picked += list(head * inner + rng.choice(inner, size=min(others, inner), replace=False))
    picked = sorted({int(i) for i in picked})
    return {"index": picked, "value": [float(flat[i]) for i in picked]}


def _per_token(copy, batch, hook, embedded):
    """Each target position's gradients, from batched passes of copies of the pair with one
    position's loss each: saliency, sensitivity and ℓₜ for all, dL/dP and dL/dS for ``embedded``,
    and their sums over all positions (to compare with the whole loss's)."""
    src, tgt_in, tgt_out = batch
    count = tgt_out.shape[1]
    chunk = _chunk_rows(copy, src.shape[1], count)
    found = {"nll": [], "saliency": {side: {"norm": [], "gxi": []} for side in ("source", "target")},
             "sensitivity": {kind: [] for kind in KINDS}, "sums": {}, "kept": {}}
    for start in range(0, count, chunk):
        positions = numpy.arange(start, min(count, start + chunk))
        rows = len(positions)
        result = run_pass(copy, *(numpy.repeat(x, rows, axis=0) for x in batch), positions=positions,
                          probs_grad_hook=hook, parameter_grads=False)
        found["nll"] += [float(result["nll"][r, t]) for r, t in enumerate(positions)]
        for side in ("source", "target"):
            rows_, grads = result[side], result["d_" + side]
            found["saliency"][side]["norm"].append(numpy.linalg.norm(grads, axis=-1))
            found["saliency"][side]["gxi"].append(numpy.sum(grads * rows_, axis=-1))
            found["sums"][side] = found["sums"].get(side, 0) + grads.sum(axis=0)
        keep = [r for r, t in enumerate(positions) if t in embedded]
        for kind in KINDS:
            probs, grads = result[kind]["P"], result[kind]["dP"]
            scores = softmax_backward(probs, grads)
            found["sensitivity"][kind].append(numpy.sum(probs * grads, axis=(-2, -1)).transpose(1, 0, 2))
            for name, values in (("dP", grads), ("dS", scores)):
                found["sums"][kind, name] = found["sums"].get((kind, name), 0) + values.sum(axis=1)
            if keep:  # what the page holds: attention's backward from the head's output gradient
                formulas = backward_formulas(*(result[kind][name][:, keep] for name in ("P", "V", "dO")))
                for name in ("dP", "dS"):
                    found["kept"].setdefault((kind, name), []).extend(numpy.moveaxis(formulas[name], 1, 0))
    return found


def _sum_check(total, per_token):
    """max |Σₜ dℓₜ/dX − dL/dX| for X = P, S (every head) and the embeddings, with max |dL/dX|."""
    pairs = {f"{name}.{kind}": (per_token["sums"][kind, name], total[kind][name][:, 0])
             for kind in KINDS for name in ("dP", "dS")}
    pairs.update({f"d_{side}": (per_token["sums"][side], total["d_" + side][0]) for side in ("source", "target")})
    return {name: {"max_abs_difference": float(numpy.max(numpy.abs(summed - whole))),
                   "max_abs": float(numpy.max(numpy.abs(whole)))}
            for name, (summed, whole) in pairs.items()}


def _derivation_gaps(found):
    """(4, layers, heads): max |formula − autograd| for dV = Pᵀ·dO, dP = dO·Vᵀ, dQ = dS·K/√d_k and
    dK = dSᵀ·Q/√d_k, where dP and dS are the hook point's and dQ, dK, dV the engine's."""
    probs, d_out, values = found["P"][:, 0], found["dO"][:, 0], found["V"][:, 0]
    queries, keys, scores = found["Q"][:, 0], found["K"][:, 0], found["dS"][:, 0]
    scale = 1.0 / numpy.sqrt(queries.shape[-1])
    formulas = [(numpy.swapaxes(probs, -1, -2) @ d_out, found["dV"][:, 0]),
                (d_out @ numpy.swapaxes(values, -1, -2), found["dP"][:, 0]),
                (scores @ keys * scale, found["dQ"][:, 0]),
                (numpy.swapaxes(scores, -1, -2) @ queries * scale, found["dK"][:, 0])]
    return numpy.stack([numpy.max(numpy.abs(f - a), axis=(-2, -1)) for f, a in formulas])


def _pieces(tokenizer, ids):
    return [tokenizer.id_to_piece(int(i)) for i in ids]


def explain_data(model, tokenizer, source, reference=None, *, beam_size=1, alpha=0.6, tokens=None,
                 token_values_limit=TOKEN_VALUES_LIMIT, threads=1, seed=0, probs_grad_hook=None,
                 names=("explain: the sentence", "explain: the reference")):
    """Everything the explain page shows, as a JSON-ready dict: what it cannot recompute, encoded
    compactly (``explain_codec``), and float64 values of a sample of what it recomputes.

    ``source`` is one sentence; ``reference`` its translation to teach (teacher forcing), else the
    model's own (greedy, or beam search with ``beam_size`` > 1). ``tokens`` lists the target
    positions (1 = the first target token) whose own dℓₜ/dP the page holds; by default
    as many from the first as ``token_values_limit`` numbers allow (saliency, sensitivity and
    ℓₜ are there for every token). ``threads`` limits BLAS threads (one sentence's matrices are
    small); ``seed`` draws the gradient check's random entries. ``probs_grad_hook`` is
    registered on every P (as ``register_hook``) in every backward pass: the analytic side of the
    gradient check is then what that backward gives, and the check says whether it is right (the
    tests inject a wrong backward this way). ``names`` are what errors call the sentence and the
    reference (an empty one, or one longer than the model's positions).
    """
    from ...translation.train import blas_threads

    source_ids, target_ids = sentence_pair(model, tokenizer, source, reference, beam_size, alpha, names)
    with blas_threads(threads):
        return _explain_data(model, tokenizer, source, reference, source_ids, target_ids, beam_size, alpha,
                             tokens, token_values_limit, seed, probs_grad_hook)


def _explain_data(model, tokenizer, source, reference, source_ids, target_ids, beam_size, alpha, tokens,
                  token_values_limit, seed, hook):
    copy = probed_copy(model)
    bos_id, eos_id = special_ids(tokenizer)  # the decoder starts from BOS (a Marian model's: its padding id)
    batch = (numpy.array([source_ids]), numpy.array([[bos_id] + target_ids]), numpy.array([target_ids + [eos_id]]))
    total = run_pass(copy, *batch, probs_grad_hook=hook)
    modules = attention_modules(copy)
    for kind in KINDS:
        total[kind]["dS"] = softmax_backward(total[kind]["P"], total[kind]["dP"])
    sensitivity = {kind: numpy.sum(total[kind]["P"] * total[kind]["dP"], axis=(-2, -1))[:, 0] for kind in KINDS}
    check_head = max(((kind, *numpy.unravel_index(int(numpy.argmax(numpy.abs(s))), s.shape))
                      for kind, s in sensitivity.items()), key=lambda k: abs(sensitivity[k[0]][k[1], k[2]]))
    checked = modules[check_head[0]][check_head[1]]
    parameter_grads = {name: numpy.array(linear.weight.grad) for name, linear in
                       (("W_Q", checked.w_q), ("W_K", checked.w_k), ("W_V", checked.w_v))}
    count, len_src = batch[2].shape[1], batch[0].shape[1]
    shapes = {kind: total[kind]["P"][:, 0].shape for kind in KINDS}
    embedded = _embedded_positions(tokens, count, lambda t: token_values(copy.config, len_src, count, t),
                                   token_values_limit)
    per_token = _per_token(copy, batch, hook, set(embedded))
    check = check_gradients(copy, batch, total, sensitivity, check_head, parameter_grads, seed)

    rng = numpy.random.default_rng(seed)
    stored, arrays, samples = {}, {}, {}
    for kind in KINDS:
        found = total[kind]
        for name in ("P", "Q", "K", "V", "dO"):
            stored[f"{name}.{kind}"] = encode_float16(found[name][:, 0], causal=name == "P" and kind == "dec")
        # what the page computes from its stored P, V, dO, Q, K (with a backward hook, the
        # derivation gaps say how far the engine's own gradients are from these)
        formulas = backward_formulas(*(found[name][:, 0] for name in ("P", "V", "dO", "Q", "K")))
        for name in ("dP", "dS", "dQ", "dK", "dV"):
            samples[f"{name}.{kind}"] = _samples(formulas[name], rng)
        kept = {name: numpy.stack(per_token["kept"][kind, name]) if embedded else numpy.zeros((0,) + shapes[kind])
                for name in ("dP", "dS")}
        stored[f"token.dP.{kind}"] = encode_log8(kept["dP"], embedded if kind != "enc" else None)
        samples[f"token.dS.{kind}"] = _samples(kept["dS"], rng)
        arrays[f"sensitivity.{kind}"] = sensitivity[kind]
        arrays[f"token.sensitivity.{kind}"] = numpy.concatenate(per_token["sensitivity"][kind])
        arrays[f"derivation.{kind}"] = _derivation_gaps(found)
    for side in ("source", "target"):
        grads, rows = total["d_" + side][0], total[side][0]
        arrays[f"saliency.{side}.norm"] = numpy.linalg.norm(grads, axis=-1)
        arrays[f"saliency.{side}.gxi"] = numpy.sum(grads * rows, axis=-1)
        for name in ("norm", "gxi"):
            arrays[f"token.saliency.{side}.{name}"] = numpy.concatenate(per_token["saliency"][side][name])
    arrays["rollout.enc"] = rollout(total["enc"]["P"][:, 0])
    arrays["rollout.dec"] = rollout(total["dec"]["P"][:, 0])
    arrays["rollout.cross"] = total["cross"]["P"][-1, 0].mean(axis=0) @ arrays["rollout.enc"]
    for name, value in arrays.items():  # per-token saliency and rollout: (n, n), float16 is plenty
        stored[name] = encode_float16(value, 1) if name.startswith(("token.saliency", "rollout")) else \
            encode_float32(value)

    config = copy.config
    depths = {"enc": len(copy.encoder.layers), "dec": len(copy.decoder.layers), "cross": len(copy.decoder.layers)}
    lengths = {"enc": (len(source_ids), len(source_ids)), "dec": (count, count), "cross": (count, len(source_ids))}
    sides = {"enc": ("source", "source"), "dec": ("target", "target"), "cross": ("target", "source")}
    return {
        "schema": SCHEMA, "version": SCHEMA_VERSION, "generator": f"tinyformer {__version__}",
        "model": {"layers": depths["enc"], "decoder_layers": depths["dec"], "heads": config.heads,
                  "d_model": config.d_model,
                  "d_k": config.d_model // config.heads, "d_ff": config.d_ff,
                  "max_len": config.max_len, "vocabulary": copy.tgt_vocab_size,
                  "parameters": int(model.num_parameters()), "norm_first": config.norm_first},
        "source": {"text": source.strip(), "ids": source_ids, "pieces": _pieces(tokenizer, source_ids)},
        "target": {"text": reference.strip() if reference is not None else tokenizer.decode(target_ids),
                   "given": "reference" if reference is not None else "translation",
                   "decoding": None if reference is not None else
                   ("greedy" if beam_size == 1 else f"beam search, beam {beam_size}, alpha {alpha:g}"),
                   "ids": batch[2][0].tolist(), "outputs": _pieces(tokenizer, batch[2][0]),
                   "inputs": _pieces(tokenizer, batch[1][0])},
        "loss": {"total": total["loss"], "tokens": per_token["nll"],
                 "what": "L = sum over t of -log p(y_t | y_<t, x), teacher-forced, no label smoothing"},
        "kinds": {kind: {"name": KINDS[kind], "layers": depths[kind], "heads": config.heads,
                         "rows": lengths[kind][0], "cols": lengths[kind][1], "queries": sides[kind][0],
                         "keys": sides[kind][1], "causal": kind == "dec"} for kind in KINDS},
        "token_gradients": {"positions": [t + 1 for t in embedded], "complete": len(embedded) == count,
                            "values": sum(token_values(config, len_src, count, t) for t in embedded),
                            "limit": token_values_limit,
                            "sum_check": _sum_check(total, per_token)},
        "check": check,
        "arrays": stored,
        "samples": samples,
    }


def explain(model, tokenizer, source, reference=None, **options):
    """The explain page of one sentence pair: a self-contained offline HTML document (str).

    ``options`` are ``explain_data``'s; ``explain_page.render`` draws its data.
    """
    return render(explain_data(model, tokenizer, source, reference, **options))


STEP_FIELDS = ("loss", "token_gradients", "check", "arrays", "samples")
"""What a page of several checkpoints holds once per step; the rest (tokens, shapes, the model) once."""


def explain_steps_data(steps, tokenizer, source, reference=None, *, beam_size=1, alpha=0.6, tokens=None,
                       token_values_limit=TOKEN_VALUES_LIMIT, threads=1, seed=0,
                       names=("explain: the sentence", "explain: the reference")):
    """One sentence pair across the checkpoints of one run, for a page with a step slider.

    ``steps`` lists (step, label, model), oldest first, models of one architecture and
    ``tokenizer``. The target is ``reference``, else the last model's translation, and stays the
    same at every step (teacher-forced). Each step holds ``explain_data``'s per-step fields
    (``STEP_FIELDS``) in ``"steps"``; the per-token gradients of the same target positions at every
    step, within ``token_values_limit`` / max(2, steps) numbers a step (a page of n steps is then
    at most about n/2 pages of one)."""
    from ...translation.train import blas_threads

    steps = list(steps)
    if not steps:
        raise ValueError("explain: no checkpoints to explain")
    first = steps[0][2].config.to_dict()
    for _, label, model in steps[1:]:
        other = model.config.to_dict()
        if other != first:
            differs = next(k for k in sorted(first) if first[k] != other[k])
            raise ValueError(f"explain: {label} has another model than {steps[0][1]} ({differs} "
                             f"{other[differs]}, not {first[differs]}): not one run")
    source_ids, target_ids = sentence_pair(steps[-1][2], tokenizer, source, reference, beam_size, alpha, names)
    limit = token_values_limit // max(2, len(steps))
    with blas_threads(threads):
        pages = [_explain_data(model, tokenizer, source, reference, source_ids, target_ids, beam_size, alpha, tokens,
                               limit, seed, None) for _, _, model in steps]
    data = {key: value for key, value in pages[-1].items() if key not in STEP_FIELDS}
    if reference is None:
        data["target"]["decoding"] += f", by step {steps[-1][0]} ({steps[-1][1]})"
    data["steps"] = [{"step": int(step), "checkpoint": str(label), **{key: page[key] for key in STEP_FIELDS}}
                     for (step, label, _), page in zip(steps, pages)]
    return data


def explain_steps(steps, tokenizer, source, reference=None, **options):
    """The explain page of one sentence pair across checkpoints (``explain_steps_data``'s options)."""
    return render(explain_steps_data(steps, tokenizer, source, reference, **options))
