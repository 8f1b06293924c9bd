"""Table 3 of the paper ("Variations on the Transformer architecture") at small scale.

Trains the base model and, from the same seed, tokenizer and batch order, one model per
changed setting on Multi30k En→De — (A) the number of heads at constant d_model
(d_k = d_v = d_model/h), (B) fewer query/key dimensions per head, (C) depth N, d_model and
d_ff smaller and larger, (D) dropout 0 and label smoothing 0, (E) learned positional
embeddings — and writes each one's dev (val) perplexity and greedy BLEU beside the direction
of change the paper reports (base model, newstest2013) and whether that direction reproduced.
A second base run with another seed measures the run-to-run noise; a difference smaller
than that counts as no difference.

    TINYFORMER_DATA=... python benchmarks/table3.py --quick --output benchmarks/results/table3.md
    python benchmarks/table3.py --device cuda --output benchmarks/results/table3-full.md
    python benchmarks/table3.py --smoke          # seconds: built-in synthetic data, 2 steps

``--quick`` (a 2-core CPU, about 15 minutes) trains the `tiny` size (N=2, d_model=64, h=4)
for 300 steps; the default (full) run is for a GPU: the `small` size (N=3, d_model=256,
h=4) for 3,000 steps with BLEU on the whole dev set. Run directories go to a temporary
folder, removed afterwards unless ``--keep``.
"""

import argparse
import dataclasses
import datetime
import os
import platform
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tinyformer.engine import backend  # noqa: E402
from tinyformer.model.nn import MultiHeadAttention  # noqa: E402
from tinyformer.model.nn.presets import PRESETS, check_preset  # noqa: E402
from tinyformer.translation.train import TOKENIZER_FILE, TrainConfig, Trainer, load_corpus  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import provenance  # noqa: E402  (benchmarks/ is not a package)

SCALES = {
    # A GPU: the Multi30k recipe of benchmarks/multi30k.sh, BLEU on the whole dev set.
    "full": dict(data="multi30k", preset="small", model={}, vocab_size=8000, max_tokens=4096, steps=3000,
                 warmup_steps=800, lr_factor=1.0, bleu_samples=None, threads=None, device="cuda"),
    # A 2-core CPU in about 15 minutes: `tiny`, a 4k joint BPE, a few hundred steps.
    "quick": dict(data="multi30k", preset="tiny", model={}, vocab_size=4000, max_tokens=2048, steps=300,
                  warmup_steps=200, lr_factor=1.0, bleu_samples=200, threads=1, device="cpu"),
    # The machinery only (tests): the built-in task, a very small model, two steps.
    "smoke": dict(data="synthetic", preset="tiny", model=dict(d_model=16, d_ff=32, num_layers=1),
                  vocab_size=120, max_tokens=256, steps=2, warmup_steps=4, lr_factor=1.0, bleu_samples=4,
                  threads=1, device="cpu"),
}

BLEU_FLOOR = 0.3  # BLEU points: the smallest difference counted, whatever the seed spread
PPL_FLOOR = 0.01  # relative perplexity difference counted at least

BETTER, SAME, WORSE = 1, 0, -1
WORDS = {BETTER: "better", SAME: "same", WORSE: "worse"}


@dataclasses.dataclass
class Variant:
    """One row: what changes relative to the base model, and what the paper saw when it changed."""

    id: str
    row: str  # "base", "noise", "A" ... "E"
    change: str
    paper: str  # the paper's direction, with its dev numbers
    expect: dict = dataclasses.field(default_factory=dict)  # {"ppl"|"bleu": BETTER | SAME | WORSE}
    model: dict = dataclasses.field(default_factory=dict)  # Transformer overrides
    train: dict = dataclasses.field(default_factory=dict)  # dropout / label_smoothing
    d_k: int = None  # (B): query/key dimensions kept per head
    seed: int = 0
    against: str = "base"  # "base", or "best" (the best of the other (A) rows)


# The paper's Table 3, base model: 4.92 dev perplexity, 25.8 dev BLEU (h=8, d_k=64, N=6,
# d_model=512, d_ff=2048, dropout 0.1, label smoothing 0.1, sinusoids).
def variants(base):
    """The Table 3 rows for a base model ``base`` (a ``TransformerConfig.to_dict()``; label smoothing
    is the training's default), scaled down: each paper row's factor is applied to the base's value."""
    n, d, d_ff, h = base["num_layers"], base["d_model"], base["d_ff"], base["heads"]
    d_k = d // h
    rows = [
        Variant("base", "base", f"N={n}, d_model={d}, d_ff={d_ff}, h={h}, d_k={d_k}, dropout "
                f"{base['dropout']}, label smoothing {TrainConfig.label_smoothing}, sinusoids",
                "base: ppl 4.92, BLEU 25.8"),
        Variant("base-seed1", "noise", "the base model, seed 1 (initialisation, batch order, dropout)",
                "run-to-run noise (not in the paper)", seed=1),
    ]
    # (A) The paper's h=1, 16, 32 against its base h=8 are h/8 = 1/8, 2, 4; ours: 1 head, 2× and 4× the base.
    heads = [(1, {"bleu": WORSE, "ppl": WORSE}, "worse than the best: 1 head 24.9 BLEU, ppl 5.29 (best 25.8, 4.91)"),
             (2 * h, {"bleu": SAME, "ppl": SAME}, "as good as the best: 16 heads 25.8, ppl 4.91 (best 25.8, 4.91)"),
             (4 * h, {"bleu": WORSE, "ppl": WORSE}, "too many heads hurt: 32 heads 25.4, ppl 5.01 (best 25.8, 4.91)")]
    for count, expect, paper in heads:
        if count != h and d % count == 0:
            rows.append(Variant(f"A-h{count}", "A", f"h={count} (d_k=d_v={d // count})", paper, expect,
                                model=dict(heads=count), against="best"))
    # (B) The paper's d_k 32 and 16 with d_v 64: 1/2 and 1/4 of the base's d_k.
    for factor, paper in ((2, "worse: d_k 32 25.4 BLEU, ppl 5.01"), (4, "worse: d_k 16 25.1 BLEU, ppl 5.16")):
        if d_k // factor >= 1:
            rows.append(Variant(f"B-dk{d_k // factor}", "B", f"d_k={d_k // factor} (d_v={d_k}, h={h})", paper,
                                {"bleu": WORSE, "ppl": WORSE}, d_k=d_k // factor))
    # (C) The paper's N 2/4 and 8 against 6, d_model and d_ff halved and doubled.
    worse, better = {"bleu": WORSE, "ppl": WORSE}, {"bleu": BETTER, "ppl": BETTER}
    small_n = max(1, n // 2)
    if small_n != n:
        rows.append(Variant(f"C-N{small_n}", "C", f"N={small_n}", "smaller is worse: N=2 23.7 BLEU, ppl 6.11; "
                            "N=4 25.3, 5.19", worse, model=dict(num_layers=small_n)))
    rows += [
        Variant(f"C-N{2 * n}", "C", f"N={2 * n}", "bigger is better in ppl: N=8 ppl 4.88 (BLEU 25.5, "
                "0.3 below base: not judged)", {"ppl": BETTER}, model=dict(num_layers=2 * n)),
        Variant(f"C-d{d // 2}", "C", f"d_model={d // 2} (d_k={d // 2 // h}, d_ff={d_ff})",
                "smaller is worse: d_model 256 24.5 BLEU, ppl 5.75", worse, model=dict(d_model=d // 2)),
        Variant(f"C-d{2 * d}", "C", f"d_model={2 * d} (d_k={2 * d // h}, d_ff={d_ff})",
                "bigger is better: d_model 1024 26.0 BLEU, ppl 4.66", better, model=dict(d_model=2 * d)),
        Variant(f"C-ff{d_ff // 2}", "C", f"d_ff={d_ff // 2}", "smaller is worse: d_ff 1024 25.4 BLEU, ppl 5.12",
                worse, model=dict(d_ff=d_ff // 2)),
        Variant(f"C-ff{2 * d_ff}", "C", f"d_ff={2 * d_ff}", "bigger is better: d_ff 4096 26.2 BLEU, ppl 4.75",
                better, model=dict(d_ff=2 * d_ff)),
        # (D) Dropout 0 and label smoothing 0.
        Variant("D-drop0", "D", "dropout 0", "worse (over-fitting): 24.6 BLEU, ppl 5.77", worse,
                train=dict(dropout=0.0)),
        Variant("D-ls0", "D", "label smoothing 0", "ppl better, BLEU worse: 25.3 BLEU, ppl 4.67",
                {"bleu": WORSE, "ppl": BETTER}, train=dict(label_smoothing=0.0)),
        # (E) Learned positional embeddings.
        Variant("E-learned", "E", "learned positional embeddings", "nearly identical: 25.7 BLEU, ppl 4.92",
                {"bleu": SAME, "ppl": SAME}, model=dict(positional="learned")),
    ]
    return rows


def select(rows, spec):
    """Rows whose id or row letter is in the comma-separated ``spec`` (None: all); base always first."""
    if not spec:
        return rows
    wanted = {s.strip() for s in spec.split(",") if s.strip()}
    known = {r.id for r in rows} | {r.row for r in rows}
    unknown = sorted(wanted - known)
    if unknown:
        raise SystemExit(f"--variants: unknown {', '.join(unknown)}; known: {', '.join(r.id for r in rows)} "
                         "or a row letter A-E")
    chosen = [r for r in rows if r.id in wanted or r.row in wanted]
    if not any(r.id == "base" for r in chosen):
        chosen.insert(0, rows[0])  # every comparison is against the base run
    return chosen


# ----------------------------------------------------------------------------- (B): fewer dims per head
def restrict_query_key_dims(model, d_k):
    """Table 3 (B) emulated: each head's queries and keys keep only their first ``d_k`` dimensions.

    ``MultiHeadAttention`` ties d_k = d_model/h, so the rows of W_Q and W_K (and their biases)
    beyond ``d_k`` in every head are set to zero and a gradient hook keeps them there (Adam
    moves nothing whose gradient is always zero); values keep d_v = d_model/h, as in the
    paper's rows (B). The logits are still divided by √(d_model/h), not √d_k, so the kept W_Q
    rows are scaled by √((d_model/h)/d_k) to start from the logit scale of a true d_k head; the
    optimiser's steps on them are not rescaled. Returns how many weights were fixed at zero.
    """
    fixed = 0
    for module in model.modules():
        if not isinstance(module, MultiHeadAttention):
            continue
        if not 1 <= d_k <= module.d_k:
            raise ValueError(f"d_k={d_k} must lie in 1..{module.d_k} (d_model/heads)")
        keep = numpy.zeros((module.heads, module.d_k))
        keep[:, :d_k] = 1.0
        keep = keep.reshape(-1)
        for linear, scale in ((module.w_q, (module.d_k / d_k) ** 0.5), (module.w_k, 1.0)):
            for param, mask in ((linear.weight, keep[:, None]), (linear.bias, keep)):
                mask = backend.like(mask.astype(param.data.dtype), param.data)
                param.data = param.data * (mask * scale)
                param.register_hook(lambda grad, mask=mask: grad * mask)
                fixed += int(param.size - mask.sum() * (param.size // mask.size))
    return fixed


class VariantTrainer(Trainer):
    """A Trainer whose model gets the (B) restriction right after it is built."""

    def __init__(self, config, d_k=None, **kwargs):
        super().__init__(config, **kwargs)
        self.d_k, self.fixed_zero = d_k, 0

    def setup(self):
        super().setup()
        if self.d_k is not None:
            self.fixed_zero = restrict_query_key_dims(self.model, self.d_k)

    def check_restriction(self):
        """The weights (B) fixed at zero are still exactly zero after training."""
        if self.d_k is None:
            return
        for module in self.model.modules():
            if isinstance(module, MultiHeadAttention):
                for linear in (module.w_q, module.w_k):
                    rows = backend.to_numpy(linear.weight.data).reshape(module.heads, module.d_k, -1)
                    if rows[:, self.d_k:].any():
                        raise AssertionError("(B): a query/key dimension beyond d_k moved during training")


# ----------------------------------------------------------------------------- running
def train_tokenizer(scale, workdir, data_dir, echo):
    """The joint BPE every variant shares, trained once (what Trainer.setup would train)."""
    from tinyformer.translation.data.tokenizer import Tokenizer

    config = TrainConfig(data=scale["data"], data_dir=data_dir, vocab_size=scale["vocab_size"])
    src, tgt = load_corpus(config, "train")
    start = time.perf_counter()
    tokenizer = Tokenizer.train(src + tgt, workdir / "tokenizer", vocab_size=scale["vocab_size"],
                                name=Path(TOKENIZER_FILE).stem)
    echo(f"tokenizer: {len(tokenizer)} pieces from {len(src):,} sentence pairs "
         f"({time.perf_counter() - start:.1f}s)")
    return workdir / "tokenizer" / TOKENIZER_FILE


def run_variant(variant, scale, base_model, tokenizer_path, workdir, data_dir, echo):
    """Train one variant; returns its dev perplexity, BLEU, parameter count and time."""
    save_dir = workdir / variant.id
    save_dir.mkdir(parents=True)
    shutil.copyfile(tokenizer_path, save_dir / TOKENIZER_FILE)
    steps = scale["steps"]
    model = dict(base_model, **variant.model)
    config = TrainConfig(
        data=scale["data"], data_dir=data_dir, preset=scale["preset"], vocab_size=scale["vocab_size"],
        max_tokens=scale["max_tokens"], max_steps=steps, warmup_steps=scale["warmup_steps"],
        lr_factor=scale["lr_factor"], model_overrides=model or None, seed=variant.seed,
        threads=scale["threads"], device=scale["device"], save_dir=str(save_dir), save_every=steps,
        eval_every=steps, keep_last=1, log_every=max(1, steps // 10),
        bleu_samples=scale["bleu_samples"] or 10 ** 9, **variant.train,
    )
    start = time.perf_counter()
    trainer = VariantTrainer(config, d_k=variant.d_k, echo=lambda line: echo(f"  {line}"), progress=False)
    record = trainer.run()
    trainer.check_restriction()
    return {"ppl": record["ppl"], "bleu": record["bleu_greedy"], "sentences": record["bleu_sentences"],
            "params": trainer.model.num_parameters() - trainer.fixed_zero,
            "seconds": time.perf_counter() - start}


# ----------------------------------------------------------------------------- judging
def noise_bands(results):
    """(BLEU points, relative ppl) below which a difference is not counted: the two base seeds'
    difference, at least the floors."""
    a, b = results.get("base"), results.get("base-seed1")
    if a is None or b is None:
        return BLEU_FLOOR, PPL_FLOOR, None
    bleu = abs(a["bleu"] - b["bleu"])
    ppl = abs(a["ppl"] - b["ppl"]) / min(a["ppl"], b["ppl"])
    return max(bleu, BLEU_FLOOR), max(ppl, PPL_FLOOR), (bleu, ppl)


def observed(metric, value, reference, bands):
    """BETTER / SAME / WORSE for ``value`` against ``reference`` (lower perplexity is better)."""
    if metric == "bleu":
        change, band = value - reference, bands[0]
    else:
        change, band = (reference - value) / reference, bands[1]
    return BETTER if change > band else WORSE if change < -band else SAME


def reference_for(variant, rows, results):
    """{"ppl": value, "bleu": value} the variant is judged against: the base run, or for
    "best" the best of the other (A) rows and the base."""
    if variant.against != "best":
        return results["base"]
    group = [results[r.id] for r in rows if r.id != variant.id and (r.row == "A" or r.id == "base")
             and r.id in results]
    return {"ppl": min(g["ppl"] for g in group), "bleu": max(g["bleu"] for g in group)}


def verdict(variant, rows, results, bands):
    """("yes" | "no" | "unclear", what was seen): yes when every judged metric moved as in the
    paper or stayed within the noise, with at least one moving as in the paper; no when none
    did and at least one went the other way; unclear otherwise (all within the noise, or mixed)."""
    if not variant.expect:
        return "—", ""
    reference = reference_for(variant, rows, results)
    matches = contradictions = 0
    seen = []
    for metric, expected in variant.expect.items():
        got = observed(metric, results[variant.id][metric], reference[metric], bands)
        seen.append(f"{metric} {WORDS[got]}")
        if got == expected:
            matches += 1
        elif expected != SAME and got == SAME:
            pass
        else:
            contradictions += 1
    answer = "yes" if matches and not contradictions else "no" if contradictions and not matches else "unclear"
    return answer, ", ".join(seen)


# ----------------------------------------------------------------------------- reporting
COLUMNS = ["variant", "what changed", "params", "dev ppl", "dev BLEU", "paper's direction (paper's dev numbers)",
           "agrees?", "seen (vs base, or vs best for A)", "time"]


def markdown_table(rows, results, bands):
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "|".join("---" for _ in COLUMNS) + "|"]
    for variant in rows:
        if variant.id not in results:
            continue
        r = results[variant.id]
        answer, seen = verdict(variant, rows, results, bands)
        cells = [variant.id, variant.change,
                 f"{r['params']:,}", f"{r['ppl']:.2f}", f"{r['bleu']:.2f}", variant.paper, answer, seen,
                 f"{r['seconds']:.0f}s"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def hardware(device):
    text = (f"{provenance.cpu_model()}, {os.cpu_count()} logical CPUs ({provenance.usable_cores()} usable), "
            f"{platform.system()}")
    if device == "cuda":
        try:
            import cupy

            props = cupy.cuda.runtime.getDeviceProperties(0)
            name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
            text += f"; GPU: {name}"
        except Exception as error:  # the report still gets written
            text += f"; GPU: unknown ({error})"
    return text


def summary(rows, results, bands):
    counts = {}
    for variant in rows:
        if variant.id in results and variant.expect:
            answer = verdict(variant, rows, results, bands)[0]
            counts.setdefault(answer, []).append(variant.id)
    parts = [f"{answer}: {len(ids)} ({', '.join(ids)})" for answer, ids in sorted(counts.items())]
    return "; ".join(parts) if parts else "nothing judged"


def report(rows, results, scale, context):
    bands = noise_bands(results)
    spread = bands[2]
    base = context["base_model"]
    lines = [
        "# Table 3 at small scale (`benchmarks/table3.py`)",
        "",
        f"**Command:** `{context['command']}`",
        f"**Date:** {context['date']}. **Wall time:** {context['wall'] / 60:.1f} minutes in all.",
        f"**Hardware:** {context['hardware']}; device `{scale['device']}`, BLAS threads "
        f"{scale['threads'] or 'default'}; load average {context['load_before']} before and "
        f"{context['load_after']} after the run (a shared machine: timings are noisy).",
        f"**Library:** commit {context['commit']}; Python {platform.python_version()}, NumPy {numpy.__version__}.",
        f"**Setup:** {scale['data']} En→De, one joint BPE of {context['vocab']} pieces shared by every run; "
        f"base model `{scale['preset']}` (N={base['num_layers']}, d_model={base['d_model']}, "
        f"d_ff={base['d_ff']}, h={base['heads']}); {scale['steps']} steps of about {scale['max_tokens']:,} "
        f"target tokens, Noam warm-up {scale['warmup_steps']} (factor {scale['lr_factor']}, so the peak "
        f"learning rate scales as d_model^-0.5), seed 0 for every variant (the same batches). Dev "
        f"perplexity: the plain NLL per BPE token over the whole val split (1,014 sentences for "
        f"Multi30k); dev BLEU: sacreBLEU, greedy decoding, on the first {context['bleu_sentences']} val "
        "sentences. The paper's numbers are newstest2013 En→De, base model (N=6, d_model=512, h=8) "
        "after 100k steps, beam search, per-wordpiece perplexity.",
        "",
        markdown_table(rows, results, bands),
        "",
        "**Noise and the verdict.** " + (
            f"The base model with seed 1 differs from seed 0 by {spread[0]:.2f} BLEU and "
            f"{100 * spread[1]:.1f} % perplexity; " if spread else
            "No second base seed was run, so only the floors apply; ")
        + f"a difference counts only beyond {bands[0]:.2f} BLEU and {100 * bands[1]:.1f} % perplexity (the "
        f"seed difference, at least {BLEU_FLOOR} BLEU and {100 * PPL_FLOOR:.0f} %). One pair of seeds is a "
        "rough noise estimate. *Seen* says whether each metric came out better, worse or the same (within "
        "that band) than the base run — for (A), than the best of the base and the other (A) runs, as the "
        "paper compares with its best head count. *Agrees?* is yes when every judged metric moved as the "
        "paper's did or stayed within the noise, with at least one moving as the paper's; no when none "
        "did and one went the other way; unclear otherwise.",
        "",
        "**(B) is emulated.** tinyformer's `MultiHeadAttention` ties d_k = d_model/h, so (B) keeps the "
        "base's heads and d_v and zeroes, in every attention layer, the rows of W_Q and W_K (and their "
        "biases) beyond the first d_k of each head, with a gradient hook that keeps them at zero (checked "
        "after training). Attention logits are then dot products over d_k dimensions, as in the paper's "
        "rows (B). The scores are still divided by √(d_model/h) instead of √d_k; the kept W_Q rows start "
        "scaled by √((d_model/h)/d_k) so the initial logits have the scale of a true d_k head, but "
        "Adam's steps on them are not rescaled. Its parameter count leaves out the weights fixed at zero.",
        "",
        "**Mapping to the paper.** (A) compares 1 head, 2× and 4× the base's heads with the paper's 1, 16 "
        "and 32 heads (against its base 8); (B) d_k at 1/2 and 1/4 of the base's, as the paper's 32 and 16 "
        "of 64; (C) halves and doubles N, d_model (heads fixed, so d_k follows) and d_ff one at a time; "
        "(E)'s table has max_len = 1,024 rows (counted in its parameters), of which only the positions "
        "up to the longest sentence are trained. The paper's N=8 row has better perplexity but 0.3 lower "
        "BLEU than its base, so only perplexity is judged there.",
        "",
        f"**Summary:** {summary(rows, results, bands)}.",
    ]
    if scale["steps"] < 1000:
        lines += ["", f"At this scale ({scale['steps']} steps, well under the time any of these models needs to "
                  "converge) the comparison mostly measures how fast each variant learns early in training, "
                  "not where it ends: bigger models and regularisation (dropout, label smoothing) can look "
                  "worse early and better later, and over-fitting — what dropout prevents — has not begun. "
                  "A no or unclear here is not evidence against the paper; the full run (`--device cuda`) "
                  "is the real test."]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- main
def inside(path, folder):
    try:
        Path(path).resolve().relative_to(Path(folder).resolve())
        return True
    except ValueError:
        return False


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="a 2-core CPU in about 15 minutes (tiny, 300 steps)")
    size.add_argument("--smoke", action="store_true", help="seconds: synthetic data, 2 steps (for the tests)")
    p.add_argument("--variants", help="comma-separated ids or row letters (default: all), e.g. base,A,E-learned")
    p.add_argument("--device", help="cpu or cuda (default: cuda for the full run, else cpu)")
    p.add_argument("--steps", type=int, help="training steps per variant")
    p.add_argument("--preset", help="the base model's size (default: small; tiny with --quick)")
    p.add_argument("--vocab-size", type=int)
    p.add_argument("--max-tokens", type=int)
    p.add_argument("--warmup-steps", type=int)
    p.add_argument("--bleu-samples", type=int, help="dev sentences translated for BLEU (default: 200 quick, all full)")
    p.add_argument("--threads", type=int, help="BLAS threads")
    p.add_argument("--data-dir", help="where multi30k/ files are (default: $TINYFORMER_DATA/multi30k, ...)")
    p.add_argument("--workdir", help="a folder for the run directories (default: a new temporary folder)")
    p.add_argument("--keep", action="store_true", help="keep the run directories")
    p.add_argument("--output", help="also write the markdown report to this file")
    p.add_argument("--list", action="store_true", help="print the variants and exit")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    scale = dict(SCALES["smoke" if args.smoke else "quick" if args.quick else "full"])
    for key in ("device", "steps", "preset", "vocab_size", "max_tokens", "warmup_steps", "bleu_samples", "threads"):
        if getattr(args, key) is not None:
            scale[key] = getattr(args, key)
    try:
        check_preset(scale["preset"])
    except ValueError as error:
        raise SystemExit(f"--preset: {error}") from None
    base_model = dict(scale["model"])
    base = PRESETS[scale["preset"]].replace(**base_model).to_dict()
    rows = select(variants(base), args.variants)
    if args.list:
        for r in rows:
            print(f"{r.id:12s} ({r.row}) {r.change}  —  paper: {r.paper}")
        return 0
    backend.check_device(scale["device"])

    def echo(line):
        print(line, file=sys.stderr, flush=True)

    if args.workdir:
        workdir = Path(args.workdir)
        data_root = os.environ.get("TINYFORMER_DATA")
        for folder, what in ((REPO, "the repository"), (data_root, "the data folder"), (args.data_dir, "the data folder")):
            if folder and inside(workdir, folder):
                raise SystemExit(f"--workdir {workdir} is inside {what} ({folder}): choose a temporary folder")
        workdir.mkdir(parents=True, exist_ok=True)
        if any(workdir.iterdir()):
            raise SystemExit(f"--workdir {workdir} is not empty")
    else:
        workdir = Path(tempfile.mkdtemp(prefix="tinyformer-table3-"))
    context = {"command": "python " + " ".join(shlex.quote(a) for a in
                                               ["benchmarks/table3.py", *(sys.argv[1:] if argv is None else argv)]),
               "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"), "hardware": hardware(scale["device"]),
               "commit": provenance.git_commit(dirty=True), "load_before": " ".join(f"{x:.1f}" for x in os.getloadavg()),
               "base_model": base}
    start = time.perf_counter()
    results = {}
    try:
        echo(f"table3: {len(rows)} runs of {scale['steps']} steps in {workdir}")
        tokenizer_path = train_tokenizer(scale, workdir, args.data_dir, echo)
        from tinyformer.translation.data.tokenizer import Tokenizer

        context["vocab"] = len(Tokenizer.load(tokenizer_path))
        for i, variant in enumerate(rows, 1):
            echo(f"[{i}/{len(rows)}] {variant.id}: {variant.change}")
            results[variant.id] = run_variant(variant, scale, base_model, tokenizer_path, workdir,
                                              args.data_dir, echo)
            r = results[variant.id]
            echo(f"  -> dev ppl {r['ppl']:.2f}, BLEU {r['bleu']:.2f}, {r['params']:,} parameters, "
                 f"{r['seconds']:.0f}s (elapsed {(time.perf_counter() - start) / 60:.1f} min)")
    finally:
        if args.keep:
            echo(f"run directories kept in {workdir}")
        elif args.workdir:  # the caller's folder stays, emptied of what this run put there
            for child in workdir.iterdir():
                shutil.rmtree(child, ignore_errors=True)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    context["wall"] = time.perf_counter() - start
    context["load_after"] = " ".join(f"{x:.1f}" for x in os.getloadavg())
    context["bleu_sentences"] = results["base"]["sentences"]
    text = report(rows, results, scale, context)
    print(text)
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(text, encoding="utf-8")
        echo(f"report written to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
