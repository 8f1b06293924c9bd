"""Pictures for studying the model: attention heatmaps, the learning-rate schedule and training
curves, drawn with matplotlib (the ``plot`` extra).

Figures are built with matplotlib's object-oriented API on the Agg canvas and written
to files: no pyplot state, no display, nothing changes for a notebook that imports
this module. Sizes are fixed in inches at ``DPI`` so that a figure's pixel size is
predictable.
"""

import contextlib
import json
import math
from pathlib import Path

import numpy

from ...engine import backend
from ...model.nn import MultiHeadAttention, inference
from ...model.nn.probe import AttentionProbe
from ...common.validation import check_int, is_real
from .sentence import sentence_pair, special_ids

__all__ = [
    "PlotExtraMissing", "DPI", "PLOT_EXTRA_HINT", "require_matplotlib", "ATTENTION_KINDS", "attention_maps",
    "plot_attention", "attention_figure_size", "SCHEDULE_INCHES", "plot_schedule", "read_metrics",
    "CURVES_INCHES", "plot_curves",
]

DPI = 100
PLOT_EXTRA_HINT = "install the 'plot' extra: pip install -e '.[plot]'"


class PlotExtraMissing(ImportError):
    """matplotlib is not installed."""


def require_matplotlib():
    """Raise ``PlotExtraMissing`` (an ImportError saying what to install) unless matplotlib imports."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as error:
        raise PlotExtraMissing(f"plots need matplotlib: {PLOT_EXTRA_HINT}") from error


def _figure(width, height):
    """A matplotlib Figure of ``width`` × ``height`` inches on an Agg canvas (never a window),
    laid out by matplotlib's constrained layout (titles and tick labels never clipped)."""
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def _save(figure, path):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=DPI)
    return path


# ------------------------------------------------------------------ attention heatmaps
ATTENTION_KINDS = {
    "encoder_self": "encoder self-attention",
    "decoder_self": "decoder self-attention (causal)",
    "decoder_cross": "decoder-encoder attention",
}
PANEL_INCHES = 3.5
"""The longer side of one head's heatmap for sentences up to 16 tokens; longer ones get ``INCHES_PER_TOKEN``."""
INCHES_PER_TOKEN = 0.22
LABEL_INCHES = 0.8
TITLE_INCHES = 0.6
MIN_WIDTH_INCHES = 6.0
HEADS_PER_ROW = 4


@contextlib.contextmanager
def _attention_kept(model):
    """A recording probe (``nn.probe.AttentionProbe``) in every MultiHeadAttention of ``model``; on
    leaving, each module's own probe, with its switch and records, is put back."""
    modules = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    before = [m.probe for m in modules]
    for module in modules:
        module.probe = AttentionProbe(keep=True)
    try:
        yield
    finally:
        for module, probe in zip(modules, before):
            module.probe = probe


def _weights(attention):
    """(heads, len_q, len_k) NumPy probabilities of a MultiHeadAttention's last call (batch of one)."""
    return backend.to_numpy(attention.attention_probs.data)[0].astype(numpy.float64)


def attention_maps(model, tokenizer, sentence, beam_size=1, alpha=0.6):
    """Translate ``sentence``, then take the attention probabilities of a teacher-forced pass over it.

    The source is ``tokenizer.encode(sentence) + [EOS]`` (as ``decode.translate``
    feeds it); the translation comes from ``greedy_decode`` (``beam_size=1``) or
    ``beam_search``. The decoder is fed BOS (the tokenizer's: a Marian model's padding id) + the
    translation, so query i is the position that predicts token i + 1. Returns a dict: ``source`` and ``target``
    (token pieces: source ids, decoder inputs), ``translation`` (text) and ``maps``,
    {(kind, layer): (heads, len_q, len_k) array} with kind in ``ATTENTION_KINDS`` and
    layers counted from 1 (§3.2.3: the three uses of attention).
    """
    source, tokens = sentence_pair(model, tokenizer, sentence, beam_size=beam_size, alpha=alpha,
                                   names=("attention_maps: the sentence", "attention_maps: the reference"))
    src = numpy.array([source], dtype=numpy.int64)
    tgt_in = numpy.array([[special_ids(tokenizer)[0]] + list(tokens)], dtype=numpy.int64)
    maps = {}
    with inference(model), _attention_kept(model):
        model(src, tgt_in)
        for n, layer in enumerate(model.encoder.layers, 1):
            maps["encoder_self", n] = _weights(layer.self_attn)
        for n, layer in enumerate(model.decoder.layers, 1):
            maps["decoder_self", n] = _weights(layer.self_attn)
            maps["decoder_cross", n] = _weights(layer.cross_attn)
    return {
        "source": [tokenizer.id_to_piece(i) for i in source],
        "target": [tokenizer.id_to_piece(int(i)) for i in tgt_in[0]],
        "translation": tokenizer.decode(tokens),
        "maps": maps,
    }


def _cell_inches(len_q, len_k):
    return max(PANEL_INCHES / max(len_q, len_k, 1), INCHES_PER_TOKEN)


def attention_figure_size(heads, len_q, len_k):
    """(width, height) in inches of one attention figure: ``HEADS_PER_ROW`` heads per row, square cells.

    A cell is PANEL_INCHES / max(len_q, len_k) inches, at least INCHES_PER_TOKEN; each
    panel adds LABEL_INCHES for the token labels, the figure TITLE_INCHES for its title.
    """
    cell = _cell_inches(len_q, len_k)
    columns = min(heads, HEADS_PER_ROW)
    rows = math.ceil(heads / columns)
    width = columns * (cell * len_k + LABEL_INCHES)
    height = rows * (cell * len_q + LABEL_INCHES) + TITLE_INCHES
    return max(width, MIN_WIDTH_INCHES), height


def _heatmap_figure(weights, queries, keys, title):
    heads = weights.shape[0]
    figure = _figure(*attention_figure_size(heads, len(queries), len(keys)))
    columns = min(heads, HEADS_PER_ROW)
    axes = numpy.atleast_1d(figure.subplots(math.ceil(heads / columns), columns, squeeze=False)).ravel()
    small = min(9.0, 0.55 * 72 * _cell_inches(len(queries), len(keys)))  # points: about half a cell
    for head, ax in enumerate(axes):
        if head >= heads:
            ax.set_axis_off()
            continue
        ax.imshow(weights[head], cmap="viridis", vmin=0.0, vmax=1.0, aspect="equal", interpolation="nearest")
        ax.set_title(f"head {head + 1}", fontsize=9)
        ax.set_xticks(range(len(keys)), labels=keys, rotation=90, fontsize=small)
        if head % columns == 0:  # the queries are the same for every head of a row
            ax.set_yticks(range(len(queries)), labels=queries, fontsize=small)
        else:
            ax.set_yticks([])
    figure.suptitle(title, fontsize=10)
    return figure


def plot_attention(model, tokenizer, sentence, out_dir, beam_size=1, alpha=0.6):
    """One PNG per (kind, layer) in ``out_dir``, one heatmap per head, tokens as tick labels.

    Files are ``encoder_self_layer1.png``, ``decoder_self_layer1.png``,
    ``decoder_cross_layer1.png``, ... (rows: queries, columns: keys; colour 0 to 1).
    Returns ``(translation, [paths])``.
    """
    found = attention_maps(model, tokenizer, sentence, beam_size, alpha)
    out_dir = Path(out_dir)
    paths = []
    for (kind, layer), weights in found["maps"].items():
        queries = found["source"] if kind == "encoder_self" else found["target"]
        keys = found["target"] if kind == "decoder_self" else found["source"]
        title = f"{ATTENTION_KINDS[kind]}, layer {layer}\n{sentence.strip()}  →  {found['translation']}"
        paths.append(_save(_heatmap_figure(weights, queries, keys, title), out_dir / f"{kind}_layer{layer}.png"))
    return found["translation"], paths


# ------------------------------------------------------------------ the learning-rate schedule
SCHEDULE_INCHES = (8, 5)


def plot_schedule(path="schedule.png", d_model=512, warmup_steps=4000, steps=20000, factor=1.0):
    """The learning rate of §5.3 over steps 1 .. ``steps``, its peak marked; returns the path.

    lrate = factor · d_model^-0.5 · min(step^-0.5, step · warmup_steps^-1.5): linear
    warm-up for ``warmup_steps`` steps, then decay with 1/√step (``optim.NoamSchedule``).
    """
    from ...model.optim import NoamSchedule

    steps = check_int("plot_schedule: steps", steps, 1)
    schedule = NoamSchedule(d_model, warmup_steps, factor)
    points = numpy.linspace(1, steps, min(steps, 4000)).round().astype(numpy.int64)
    points = numpy.unique(numpy.append(points, min(warmup_steps, steps)))
    rates = [schedule(int(s)) for s in points]
    figure = _figure(*SCHEDULE_INCHES)
    ax = figure.subplots()
    ax.plot(points, rates, color="tab:blue")
    if warmup_steps <= steps:
        peak_step, peak = schedule.peak()
        ax.plot([peak_step], [peak], "o", color="tab:red")
        ax.annotate(f"peak {peak:.2e} at step {peak_step}", (peak_step, peak), textcoords="offset points",
                    xytext=(10, -4), fontsize=9)
    ax.set_xlabel("step")
    ax.set_ylabel("learning rate")
    ax.set_title(f"Noam schedule (§5.3): d_model={d_model}, warmup_steps={warmup_steps}"
                 + (f", factor={factor:g}" if factor != 1 else ""))
    ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    ax.grid(alpha=0.3)
    return _save(figure, path)


# ------------------------------------------------------------------ training curves
CURVES_INCHES = (13, 7)


def read_metrics(path):
    """The records of a ``metrics.jsonl`` as dicts (blank lines skipped).

    A line that is not a JSON object with a numeric "step" raises ValueError naming
    the file and the line number.
    """
    records = []
    with open(path, encoding="utf-8") as stream:
        for number, line in enumerate(stream, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}, line {number}: not JSON ({error.msg}, column {error.colno}); "
                                 "a metrics log holds one JSON object per line") from None
            if not isinstance(record, dict):
                raise ValueError(f"{path}, line {number}: expected a JSON object, got {type(record).__name__}")
            if not is_real(record.get("step")):
                raise ValueError(f"{path}, line {number}: the record has no numeric \"step\"")
            records.append(record)
    return records


def _series(records, key):
    points = [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float))]
    return [p[0] for p in points], [p[1] for p in points]


_PANELS = [
    # (title, [(split, key, label)], log scale)
    ("loss per token (label-smoothed)", [("train", "loss", "train"), ("val", "loss", "validation")], False),
    ("perplexity", [("train", "ppl", "train"), ("val", "ppl", "validation")], True),
    ("BLEU", [("val", "bleu_greedy", "validation, greedy"), ("test", "bleu", "test, beam search")], False),
    ("learning rate", [("train", "lr", None)], False),
    ("gradient norm (before clipping)", [("train", "grad_norm", None)], False),
    ("throughput (target tokens/s)", [("train", "tokens_per_s", None)], False),
]


def plot_curves(log_path, path="curves.png"):
    """Training and validation curves of a ``metrics.jsonl`` (written by ``tinyformer train``); returns the path.

    Training records are those without "split"; validation records have
    ``"split": "val"`` (loss, ppl, bleu_greedy); a final ``"split": "test"`` record
    adds its BLEU as a point. A panel with no data says so.
    """
    records = read_metrics(log_path)
    if not records:
        raise ValueError(f"{log_path}: no records to plot")
    splits = {"train": [r for r in records if r.get("split", "train") == "train"],
              "val": [r for r in records if r.get("split") == "val"],
              "test": [r for r in records if r.get("split") == "test"]}
    figure = _figure(*CURVES_INCHES)
    for ax, (title, series, log) in zip(figure.subplots(2, 3).ravel(), _PANELS):
        drawn = 0
        for split, key, label in series:
            steps, values = _series(splits[split], key)
            if values:
                style = "o-" if split != "train" or len(values) == 1 else "-"
                ax.plot(steps, values, style, markersize=4 if split != "test" else 8, label=label)
                drawn += 1
        if not drawn:
            ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", va="center", color="grey")
        elif log:
            ax.set_yscale("log")
        if drawn and any(label for _, _, label in series):
            ax.legend(fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step", fontsize=9)
        ax.grid(alpha=0.3)
    figure.suptitle(str(log_path), fontsize=10)
    return _save(figure, path)
