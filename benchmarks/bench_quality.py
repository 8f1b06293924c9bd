"""Translation quality at equal data (issue 28): tinyformer and PyTorch trained on identical batches.

Both models are trained on the same batch list, made by tinyformer's own pipeline (its joint BPE
tokenizer, ``ParallelData.batches`` in the order ``tinyformer train`` takes them for the seed: epoch
after epoch, one batch per step), for any number of steps and any seed, then scored with the same
decoder: tinyformer's ``translate`` (beam 4, alpha 0.6 by default) and sacreBLEU on Multi30k
``test_2016_flickr`` (``tinyformer eval``'s scoring). The PyTorch model (``torch_transformer``:
``nn.Transformer``, tied embeddings x sqrt(d_model), the same sinusoids, post-LN) is trained with
``torch.optim.Adam`` (0.9, 0.98, 1e-9) on the same Noam schedule and ``F.cross_entropy`` with the same
label smoothing; its trained weights are copied back into a tinyformer model of the same structure
for decoding. tinyformer trains through ``Trainer.train_step``, the step of ``tinyformer train``.

Each engine trains in a process of its own with one thread (OMP/OpenBLAS/MKL and PyTorch), both at
the same time by default (``--sequential``: one after the other). Each records its loss per step
(label-smoothed, per target token), its step times and the fingerprint of the batch list it was
given; the report compares them and says whether the two lists were identical.

The configuration differences between tinyformer's paper model and stock ``nn.Transformer`` are
switched one by one with ``--tf-extras`` and ``--torch-extras`` (comma-separated, or ``none`` /
``all`` / ``preset``): ``attention-dropout`` (dropout p on the attention probabilities), ``activation-dropout``
(after the feed-forward ReLU), ``final-norm`` (a LayerNorm after each stack, also post-LN) and
``torch-init`` (nn.Transformer's initialisation: Q, K, V Xavier-uniform as one packed 3d x d matrix,
feed-forward biases U(+-1/sqrt(fan_in))). Defaults: tinyformer ``preset``, the preset's own model as
``tinyformer train`` builds it (``small``: all four; ``none`` is the paper's model), PyTorch all (stock).

The recipe comparison (issue 49: "the same recipe in PyTorch, side by side on identical batches:
tinyformer's wall time to the same validation NLL <= 0.7x PyTorch's"): ``--schedule linear`` gives
both engines the step-count twin of ``tinyformer train --schedule time``, lr(step) = peak *
min(step / warmup, 1) * min(1, (1 - step / steps) / decay_fraction) with Noam's peak lr_factor *
d_model^-0.5 * warmup^-0.5 (``--decay-fraction``, default 1), from one function (``linear_lr``) both
children call; each records the lr of every step, and the report says whether they were the same.
``--val-every N`` has each engine compute the validation NLL (per target token, no label smoothing,
dropout off, the validation split batched once through the same tokenizer: tinyformer's
``validation_loss``, the same sum / count in PyTorch) before the first step, every N steps and at the
last, with its cumulative training seconds (the steps' own times: validation excluded). The report
tabulates them and gives the wall time to the same validation NLL: the target is the larger of the two
final NLLs, each engine's training seconds at its first validation at or under it (interpolated
linearly from the one before), and their ratio tinyformer / PyTorch.

``--equal-init`` tests the engines themselves: PyTorch starts from tinyformer's initial weights,
dropout is off everywhere, both have the same extras, and the report gives the largest relative
difference of the two loss curves in each window of 100 steps. Its control, ``--equal-init --engines
tinyformer,tinyformer-ulp``, trains tinyformer against itself with every initial weight moved one
unit in the last place: how far float32 rounding alone parts two curves over the same steps.

    python benchmarks/bench_quality.py --steps 800 --seed 0 [--tf-extras preset] [--torch-extras all]
    python benchmarks/bench_quality.py --steps 300 --equal-init --no-score
    python benchmarks/bench_quality.py --steps 300 --equal-init --no-score --engines tinyformer,tinyformer-ulp
    python benchmarks/bench_quality.py --steps 2600 --schedule linear --warmup-steps 400 --lr-factor 2 --val-every 200
    python benchmarks/bench_quality.py --data synthetic --preset tiny --steps 20 --limit 50   (a smoke run)
    python benchmarks/bench_quality.py --data synthetic --preset tiny --steps 20 --schedule linear --warmup-steps 5 \
        --val-every 5 --no-score   (a smoke run of the recipe comparison)

``--report FILE`` appends the markdown report (command, date, commit, machine) to FILE;
``--work DIR`` (default runs/bench-quality) holds the shared tokenizer, each engine's log and its
JSON result (every step's loss, time and learning rate; the validations).
"""

import argparse
import hashlib
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import provenance  # noqa: E402  (benchmarks/ is not a package)

# "tinyformer-ulp": tinyformer with every initial weight moved one unit in the last place (float32
# ``nextafter`` towards +inf), the control of --equal-init: how far rounding alone parts two curves.
ENGINES = ("tinyformer", "torch", "tinyformer-ulp")
ENGINE_NAMES = {"tinyformer": "tinyformer", "torch": "PyTorch", "tinyformer-ulp": "tinyformer (init + 1 ulp)"}
EXTRAS = ("attention-dropout", "activation-dropout", "final-norm", "torch-init")
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


# ----------------------------------------------------------------------------- configuration
def parse_extras(text):
    """The extras named in ``text`` ("none", "all" or a comma-separated subset of EXTRAS), in EXTRAS' order."""
    text = text.strip()
    if text in ("none", ""):
        return ()
    if text in ("all", "stock"):
        return EXTRAS
    names = {name.strip() for name in text.split(",") if name.strip()}
    unknown = sorted(names - set(EXTRAS))
    if unknown:
        raise ValueError(f"unknown extra(s) {', '.join(unknown)}; known: {', '.join(EXTRAS)}, or none / all")
    return tuple(name for name in EXTRAS if name in names)


def preset_extras(name):
    """The extras that preset ``name`` has of itself (the model ``tinyformer train --preset name`` builds),
    in EXTRAS' order; their dropout p is the run's, as for any extra."""
    from tinyformer.model.nn.presets import PRESETS

    preset = PRESETS[name]
    has = {"attention-dropout": preset.attention_dropout > 0, "activation-dropout": preset.activation_dropout > 0,
           "final-norm": preset.final_norm is True, "torch-init": preset.init == "torch"}
    return tuple(extra for extra in EXTRAS if has[extra])


def extras_text(extras):
    return ",".join(extras) if extras else "none"


def model_overrides(extras, dropout):
    """The Transformer arguments (``TrainConfig.model_overrides``) of ``extras`` with dropout p ``dropout``."""
    return {"attention_dropout": dropout if "attention-dropout" in extras else 0.0,
            "activation_dropout": dropout if "activation-dropout" in extras else 0.0,
            "final_norm": True if "final-norm" in extras else None,
            "init": "torch" if "torch-init" in extras else "xavier"}


def engine_extras(args, engine):
    return args.torch_extras if engine == "torch" else args.tf_extras


def tokenizer_dir(args):
    """The shared tokenizer's folder: one per data set, language pair and vocabulary size."""
    return Path(args.work) / f"tokenizer-{args.data}-{args.src}-{args.tgt}-{args.vocab_size}"


def run_config(args, engine):
    """The ``TrainConfig`` (resolved) of ``engine``'s run: the data, preset and schedule of ``tinyformer
    train``, with the engine's extras as model overrides (no dropout at all with --equal-init)."""
    from tinyformer.model.nn.presets import PRESETS
    from tinyformer.translation.train import TrainConfig

    dropout = 0.0 if args.equal_init else (args.dropout if args.dropout is not None else PRESETS[args.preset].dropout)
    config = TrainConfig(data=args.data, src_lang=args.src, tgt_lang=args.tgt, data_dir=args.data_dir,
                         preset=args.preset, vocab_size=args.vocab_size, max_tokens=args.max_tokens,
                         max_steps=args.steps, warmup_steps=args.warmup_steps, lr_factor=args.lr_factor,
                         label_smoothing=args.label_smoothing, dropout=dropout,
                         model_overrides=model_overrides(engine_extras(args, engine), dropout),
                         seed=args.seed, threads=1, device="cpu", save_dir=str(tokenizer_dir(args)),
                         beam_size=args.beam, alpha=args.alpha)
    return config.resolved()


def batch_plan(train_data, config, steps):
    """The batches of steps 1 .. ``steps`` in the order ``Trainer`` takes them (one process, accum 1,
    no skipped update): epoch after epoch, ``train_data.batches(max_tokens, seed, epoch)`` in turn."""
    if config.accum != 1:
        raise ValueError("batch_plan: one batch per step (accum 1)")
    plan, epoch = [], 0
    while len(plan) < steps:
        batches = train_data.batches(config.max_tokens, seed=config.seed, epoch=epoch)
        if not len(batches):
            raise ValueError("batch_plan: the training data gives no batch")
        plan.extend(batches[i] for i in range(min(len(batches), steps - len(plan))))
        epoch += 1
    return plan


def plan_digest(plan):
    """SHA-256 of the batches' arrays (shapes and ids of src, tgt_in, tgt_out, in order)."""
    digest = hashlib.sha256()
    for batch in plan:
        for array in (batch.src, batch.tgt_in, batch.tgt_out):
            array = numpy.ascontiguousarray(array, dtype=numpy.int64)
            digest.update(repr(array.shape).encode())
            digest.update(array.tobytes())
    return digest.hexdigest()


def linear_lr(step, steps, d_model, warmup_steps, lr_factor, decay_fraction=1.0):
    """The learning rate of step ``step`` (1 .. ``steps``) of ``--schedule linear``, the step-count twin of
    tinyformer's time-budget schedule (``TimeBudgetSchedule``, its elapsed fraction step / steps):
    peak · min(step / warmup, 1) · min(1, (1 − step / steps) / decay_fraction), peak the Noam top
    lr_factor · d_model^-0.5 · warmup^-0.5."""
    peak = lr_factor * d_model ** -0.5 * warmup_steps ** -0.5
    return peak * min(step / warmup_steps, 1.0) * min(1.0, (1.0 - step / steps) / decay_fraction)


def lr_schedule(args, d_model):
    """lr(step) for steps 1, 2, ...: the one schedule both engines' optimisers are given (``--schedule``:
    noam, tinyformer's NoamSchedule; linear, ``linear_lr``)."""
    import functools

    from tinyformer.model.optim import NoamSchedule

    if args.schedule == "linear":
        return functools.partial(linear_lr, steps=args.steps, d_model=d_model, warmup_steps=args.warmup_steps,
                                 lr_factor=args.lr_factor, decay_fraction=args.decay_fraction)
    return NoamSchedule(d_model, args.warmup_steps, args.lr_factor)


def validates_at(step, every, last):
    """Whether ``--val-every`` validates after ``step``: every ``every`` steps and at the last step."""
    return every > 0 and (step % every == 0 or step == last)


def tinyformer_validation_nll(model, val_data, max_tokens):
    """The validation NLL per target token (no label smoothing, dropout off: ``validation_loss``);
    the model is left in training mode."""
    from tinyformer.translation.train.evaluation import validation_loss

    _, nll = validation_loss(model, val_data, max_tokens, 0.0)
    model.train()
    return nll


def torch_validation_nll(torch_model, batches):
    """The same arithmetic in PyTorch: the NLL summed over the target tokens of ``batches`` (padding
    ignored, no label smoothing, eval mode) / their count; the model is left in training mode."""
    import warnings

    import torch
    from torch.nn import functional as TF

    from tinyformer.translation.data import PAD_ID

    torch_model.eval()
    vocab = torch_model.embed.weight.shape[0]
    total = tokens = 0
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the encoder's fast path: nested tensors are a prototype
        for batch in batches:
            src, tgt_in, tgt_out = (torch.from_numpy(numpy.asarray(a, dtype=numpy.int64))
                                    for a in (batch.src, batch.tgt_in, batch.tgt_out))
            logits = torch_model(src, tgt_in)
            total += TF.cross_entropy(logits.reshape(-1, vocab), tgt_out.reshape(-1), ignore_index=PAD_ID,
                                      reduction="sum").item()
            tokens += batch.num_tokens
    torch_model.train()
    return total / tokens


def time_to_nll(validations, target):
    """(training seconds, step) at which a curve of validations [(step, training seconds, NLL), ...]
    first reaches NLL <= ``target``, linearly interpolated between the validation before the crossing
    and the first at or under it (the first validation's own, if it is there already); None if never."""
    before = None
    for step, seconds, nll in validations:
        if nll <= target:
            if before is None:
                return float(seconds), float(step)
            step0, seconds0, nll0 = before
            f = (nll0 - target) / (nll0 - nll)
            return seconds0 + f * (seconds - seconds0), step0 + f * (step - step0)
        before = (step, seconds, nll)
    return None


# ----------------------------------------------------------------------------- saving and resuming
class Resume:
    """One engine's training state in ``--work``, saved every ``every`` steps (atomically: a
    temporary file, then a rename) so that an interrupted invocation, run again with the same
    arguments, continues where it stopped: the same batches, and the same weights, optimiser state,
    dropout generator and per-step records as the uninterrupted run's. A save of another batch list
    is refused (one line) rather than continued."""

    def __init__(self, work, label, engine, digest, every):
        self.path = Path(work) / "results" / f"{label}-{engine}.resume"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.digest, self.every = digest, every

    def _check(self, digest):
        if digest != self.digest:
            raise SystemExit(f"bench_quality: {self.path} was saved for another batch list (plan {digest[:12]}, "
                             f"not {self.digest[:12]}); remove it to start again")

    def save_tinyformer(self, state, done, adam_state, rng):
        from tinyformer.translation import checkpoint

        meta = {"plan_digest": self.digest, "done": done, "rng_state": rng}
        checkpoint.save_checkpoint(self.path.with_suffix(".npz"), state, meta, adam_state)

    def load_tinyformer(self):
        from tinyformer.translation import checkpoint

        path = self.path.with_suffix(".npz")
        if not path.exists():
            return None
        state, meta, adam_state = checkpoint.load_checkpoint(path)
        self._check(meta.get("plan_digest"))
        return state, meta["done"], adam_state, meta["rng_state"]

    def save_torch(self, saved):
        import torch

        path = self.path.with_suffix(".pt")
        partial = path.with_name(path.name + ".partial")
        torch.save({**saved, "plan_digest": self.digest}, partial)
        os.replace(partial, path)

    def load_torch(self):
        import torch

        path = self.path.with_suffix(".pt")
        if not path.exists():
            return None
        saved = torch.load(path, weights_only=False)
        self._check(saved.pop("plan_digest", None))
        return saved


# ----------------------------------------------------------------------------- the two engines
def train_tinyformer(parts, config, plan, log=print, log_every=50, resume=None, schedule=None, val_every=0):
    """Train ``parts.model`` on ``plan`` through ``Trainer.train_step``; per step (loss, seconds, lr).
    ``schedule``: Adam's lr(step) (``lr_schedule``; default the run's). ``val_every``: the validation
    NLL every that many steps, at the last and before the first, as (step, training seconds, NLL).
    With ``resume`` (a ``Resume``), continue from its last save and save every ``resume.every`` steps."""
    from tinyformer.engine import random as tf_random
    from tinyformer.translation.train import Trainer

    if schedule is not None:
        parts.adam.lr = schedule
    trainer = Trainer(config, parts=parts, echo=lambda *a, **k: None, progress=False)
    parts.model.train()
    done = {"losses": [], "seconds": [], "lrs": [], "validations": [], "skipped_updates": 0}
    validate = None
    if val_every:
        def validate():
            return tinyformer_validation_nll(parts.model, parts.val_data, config.max_tokens)
    if resume is not None and (saved := resume.load_tinyformer()) is not None:
        state, done, adam_state, rng = saved
        parts.model.load_state_dict(state)
        parts.adam.load_state_dict(adam_state)
        tf_random.set_rng_state(rng)
        for key in ("lrs", "validations"):  # a state saved before these were recorded
            done.setdefault(key, [])
        log(f"tinyformer: resumed after step {len(done['losses'])}")
    if validate and not done["losses"]:
        record_validation(done, 0, validate(), "tinyformer", log)
    for step in range(len(done["losses"]) + 1, len(plan) + 1):
        done["lrs"].append(parts.adam.current_lr())  # the learning rate this step's update uses
        start = time.perf_counter()
        result = trainer.train_step([plan[step - 1]])
        loss, grad_norm = result.loss, result.grad_norm
        done["seconds"].append(time.perf_counter() - start)
        done["losses"].append(loss)
        done["skipped_updates"] += bool(grad_norm is None or not numpy.isfinite(grad_norm))
        if step % log_every == 0 or step == len(plan):
            log(f"tinyformer step {step}: loss {loss:.4f}, {statistics.median(done['seconds'][-log_every:]):.3f} s/step")
        if validate and validates_at(step, val_every, len(plan)):
            record_validation(done, step, validate(), "tinyformer", log)
        if resume is not None and (step % resume.every == 0 or step == len(plan)):
            resume.save_tinyformer(parts.model.state_dict(), done, parts.adam.state_dict(), tf_random.get_rng_state())
    return done


def train_torch(torch_model, config, plan, log=print, log_every=50, resume=None, schedule=None, val_every=0,
                val_batches=()):
    """Train the PyTorch model on ``plan``: torch.optim.Adam (0.9, 0.98, 1e-9) on ``schedule`` (lr(step),
    ``lr_schedule``; default Noam's of the run), F.cross_entropy with the run's label smoothing summed
    over the target tokens / their count. ``val_every``: the validation NLL of ``val_batches`` as
    ``train_tinyformer`` records it. With ``resume`` (a ``Resume``), continue from its last save and
    save every ``resume.every`` steps."""
    import torch
    from torch.nn import functional as TF

    from tinyformer.translation.data import PAD_ID
    from tinyformer.model.optim import NoamSchedule

    if schedule is None:
        schedule = NoamSchedule(torch_model.embed.weight.shape[1], config.warmup_steps, config.lr_factor)
    optimizer = torch.optim.Adam(torch_model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: schedule(i + 1))  # LambdaLR counts from 0
    vocab = torch_model.embed.weight.shape[0]
    torch_model.train()
    done = {"losses": [], "seconds": [], "lrs": [], "validations": [], "skipped_updates": 0}
    if resume is not None and (saved := resume.load_torch()) is not None:
        done = saved.pop("done")
        torch_model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        scheduler.load_state_dict(saved["scheduler"])
        torch.set_rng_state(saved["rng"])
        for key in ("lrs", "validations"):  # a state saved before these were recorded
            done.setdefault(key, [])
        log(f"torch: resumed after step {len(done['losses'])}")
    losses, seconds = done["losses"], done["seconds"]
    if val_every and not losses:
        record_validation(done, 0, torch_validation_nll(torch_model, val_batches), "torch", log)
    for step in range(len(losses) + 1, len(plan) + 1):
        batch = plan[step - 1]
        src, tgt_in, tgt_out = (torch.from_numpy(numpy.asarray(a, dtype=numpy.int64))
                                for a in (batch.src, batch.tgt_in, batch.tgt_out))
        start = time.perf_counter()
        done["lrs"].append(optimizer.param_groups[0]["lr"])  # the learning rate this step's update uses
        optimizer.zero_grad(set_to_none=True)
        logits = torch_model(src, tgt_in)
        total = TF.cross_entropy(logits.reshape(-1, vocab), tgt_out.reshape(-1), ignore_index=PAD_ID,
                                 label_smoothing=config.label_smoothing, reduction="sum")
        (total / batch.num_tokens).backward()
        optimizer.step()
        scheduler.step()
        loss = total.item() / batch.num_tokens
        seconds.append(time.perf_counter() - start)
        losses.append(loss)
        if step % log_every == 0 or step == len(plan):
            log(f"torch step {step}: loss {loss:.4f}, {statistics.median(seconds[-log_every:]):.3f} s/step")
        if validates_at(step, val_every, len(plan)):
            record_validation(done, step, torch_validation_nll(torch_model, val_batches), "torch", log)
        if resume is not None and (step % resume.every == 0 or step == len(plan)):
            resume.save_torch({"model": torch_model.state_dict(), "optimizer": optimizer.state_dict(),
                               "scheduler": scheduler.state_dict(), "rng": torch.get_rng_state(), "done": done})
    return done


def record_validation(done, step, nll, engine, log):
    """Append (step, training seconds so far, validation NLL) to ``done["validations"]``: the seconds
    are the sum of the steps' own, so validation time is not counted."""
    train_seconds = float(sum(done["seconds"]))
    done["validations"].append([step, train_seconds, nll])
    log(f"{engine} step {step}: validation NLL {nll:.4f} per token after {train_seconds:.1f} training s")


def score(model, tokenizer, config, limit=None):
    """sacreBLEU of ``model``'s translations of the test split (tinyformer's translate, the run's beam and alpha)."""
    from tinyformer.translation.train.builders import load_corpus
    from tinyformer.translation.train.evaluation import evaluate

    sources, references = load_corpus(config, "test")
    if limit:
        sources, references = sources[:limit], references[:limit]
    model.eval()
    start = time.perf_counter()
    result = evaluate(model, tokenizer, sources, references, beam_size=config.beam_size, alpha=config.alpha)
    result["decode_seconds"] = time.perf_counter() - start
    return result


def run_engine(args, engine, log=print):
    """One engine's whole run (in its own process): its parts, training, scoring; the result as a dict."""
    from tinyformer.translation.train import build_parts
    from tinyformer.translation.train.evaluation import validation_loss
    from tinyformer.translation.train.trainer import blas_threads

    config = run_config(args, engine)
    parts = build_parts(config, echo=lambda *a, **k: None)
    plan = batch_plan(parts.train_data, config, args.steps)
    result = {"engine": engine, "extras": list(engine_extras(args, engine)), "equal_init": args.equal_init,
              "model_config": parts.model.config.to_dict(), "params": parts.model.num_parameters(),
              "plan_digest": plan_digest(plan), "plan_batches": len(plan),
              "target_tokens": sum(b.num_tokens for b in plan), "tokenizer_sha256": parts.tokenizer.sha256,
              "versions": {"python": platform.python_version(), "numpy": numpy.__version__},
              "commit": provenance.git_commit(),  # the code this engine read, at its start
              "schedule": args.schedule, "decay_fraction": args.decay_fraction, "val_every": args.val_every}
    schedule = lr_schedule(args, parts.model.d_model)
    val_batches = ()
    if args.val_every:  # batched once, as validation_loss batches them: the same list on both sides
        val_batches = list(parts.val_data.batches(config.max_tokens, shuffle=False))
        result["val_digest"], result["val_tokens"] = plan_digest(val_batches), sum(b.num_tokens for b in val_batches)
    log(f"{engine}: {result['params']:,} parameters, {len(plan)} batches, plan {result['plan_digest'][:12]}")
    if engine == "tinyformer-ulp":
        for parameter in parts.model.parameters():
            parameter.data[...] = numpy.nextafter(parameter.data, numpy.float32(numpy.inf))
    resume = Resume(args.work, run_label(args), engine, result["plan_digest"], args.save_every) \
        if args.save_every else None
    with blas_threads(1):
        if engine != "torch":
            result.update(train_tinyformer(parts, config, plan, log, args.log_every, resume, schedule, args.val_every))
        else:
            import torch

            import torch_transformer

            torch.set_num_threads(1)
            torch.manual_seed(args.seed)
            torch_model = torch_transformer.build_torch_model(parts.model.config)
            if args.equal_init:
                torch_transformer.copy_weights(parts.model, torch_model)
            result["torch_params"] = sum(p.numel() for p in torch_model.parameters())
            result["versions"]["torch"] = torch.__version__
            result.update(train_torch(torch_model, config, plan, log, args.log_every, resume, schedule, args.val_every,
                                      val_batches))
            torch_transformer.copy_weights_back(torch_model, parts.model)  # decoded by tinyformer's search
        if args.score:
            # the validation split's loss and NLL per token, dropout off: deterministic for the weights
            result["valid_loss"], result["valid_nll"] = validation_loss(parts.model, parts.val_data, config.max_tokens,
                                                                        config.label_smoothing)
            log(f"{engine}: validation loss {result['valid_loss']:.4f}, NLL {result['valid_nll']:.4f} per token")
            scores = score(parts.model, parts.tokenizer, config, args.limit)
            result.update({k: scores[k] for k in ("bleu", "signature", "sentences", "exact_match", "decode_seconds")})
            result["hypotheses"] = scores["hypotheses"]
            log(f"{engine}: BLEU {scores['bleu']:.2f} on {scores['sentences']} sentences "
                f"({scores['decode_seconds']:.0f} s to decode)")
    return result


# ----------------------------------------------------------------------------- the report
def windows(count, size):
    """[(first step, last step)] covering steps 1 .. count in windows of ``size``."""
    return [(start, min(start + size - 1, count)) for start in range(1, count + 1, size)]


def relative_differences(a, b):
    """|a - b| / |b| per step."""
    a, b = numpy.asarray(a, dtype=numpy.float64), numpy.asarray(b, dtype=numpy.float64)
    return numpy.abs(a - b) / numpy.abs(b)


def schedule_text(args):
    """The learning-rate schedule in words, for the report."""
    if getattr(args, "schedule", "noam") == "linear":
        decay = ("from the start" if args.decay_fraction == 1
                 else f"over the last {args.decay_fraction:g} of the steps, after a plateau")
        return (f"Linear schedule (warm-up {args.warmup_steps} steps to the Noam peak of factor {args.lr_factor:g}, "
                f"then linear decay to 0 at step {args.steps}, {decay})")
    return f"Noam factor {args.lr_factor:g}, warm-up {args.warmup_steps}"


def validation_section(results, engines, threads="one thread per engine"):
    """The report's validation NLL by step (each engine's cumulative training seconds beside it) and, with
    two engines, the wall time to the same validation NLL: the target is the larger of the two final NLLs."""
    names = [ENGINE_NAMES[e] for e in engines]
    curves = {e: results[e]["validations"] for e in engines}
    by_step = {e: {v[0]: v for v in curves[e]} for e in engines}
    steps = sorted(set().union(*(by_step[e] for e in engines)))
    header = ["step"] + [f"{n} {what}" for n in names for what in ("validation NLL", "training s")]
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    for step in steps:
        row = [str(step)]
        for e in engines:
            v = by_step[e].get(step)
            row += [f"{v[2]:.4f}", f"{v[1]:.2f}"] if v else ["", ""]
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    digests = {results[e].get("val_digest") for e in engines}
    first = results[engines[0]]
    same = ("identical on both sides" if len(engines) == 2 and len(digests) == 1 and None not in digests
            else "one engine only" if len(engines) == 1 else "DIFFERENT on the two sides")
    lines.append(f"Validation NLL: per target token ({first.get('val_tokens', 0):,} tokens), no label smoothing, "
                 f"dropout off (eval mode), on the validation split batched once through the same tokenizer "
                 f"(batch list sha256 {str(first.get('val_digest'))[:16]}, {same}); tinyformer's `validation_loss` "
                 "and the same sum / count in PyTorch. Training seconds: the sum of the engine's own step times "
                 f"(validation excluded); {threads}.")
    if len(engines) == 2 and all(curves.values()):
        target = max(curves[e][-1][2] for e in engines)
        reached = {e: time_to_nll(curves[e], target) for e in engines}
        lines += ["", f"Wall time to the same validation NLL: target {target:.4f} (the larger of the two final "
                  "NLLs); each engine's training seconds when its validation NLL first reached it, linearly "
                  "interpolated between the two validations around the crossing.", ""]
        lines += ["| engine | training s to target | at step |", "|---|---:|---:|"]
        for e, name in zip(engines, names):
            r = reached[e]
            lines.append(f"| {name} | {r[0]:.2f} | {r[1]:.1f} |" if r else f"| {name} | not reached | |")
        lines.append("")
        a, b = (reached[e] for e in engines)
        if a and b and b[0] > 0:
            ratio = a[0] / b[0]
            lines.append(f"Time to validation NLL {target:.4f}, {names[0]} / {names[1]}: **{ratio:.2f}x** "
                         f"({'≤' if ratio <= 0.7 else 'NOT ≤'} 0.7, issue 49's goal). Measured as training seconds "
                         f"(each step's own wall time, summed; validation excluded), {threads}.")
        elif a and b:
            lines.append(f"Time to validation NLL {target:.4f}: no ratio ({names[1]} was there before its first step).")
        else:
            lines.append(f"Time to validation NLL {target:.4f}: no ratio (an engine did not reach it).")
    return lines


def lr_check(results, engines):
    """One line: whether the engines used the same learning rate at every step (their recorded lrs)."""
    lrs = [results[e].get("lrs") for e in engines]
    if len(engines) != 2 or not all(lrs):
        return None
    if lrs[0] == lrs[1]:
        return f"Learning rate: the same at each of the {len(lrs[0])} steps on both sides (recorded per step)."
    step = next((i + 1 for i, (x, y) in enumerate(zip(*lrs)) if x != y), min(map(len, lrs)) + 1)
    return f"Learning rate: DIFFERENT on the two sides, first at step {step}."


def shown_command(argv):
    """The command as the report shows it: folders of this machine (--work, --data-dir, an absolute
    --report) as placeholders."""
    shown, placeholders = [], {"--work": "WORK", "--data-dir": "DATA"}
    argv = list(argv)
    i = 0
    while i < len(argv):
        word = argv[i]
        name, _, inline = word.partition("=")
        if name in placeholders or (name == "--report" and os.path.isabs(inline or (argv[i + 1] if i + 1 < len(argv)
                                                                                 else ""))):
            shown.append(f"{name} {placeholders.get(name, 'REPORT')}")
            i += 1 if inline else 2
            continue
        shown.append(shlex.quote(word))
        i += 1
    return " ".join(["python benchmarks/bench_quality.py", *shown])


def run_commit(results, engines):
    """The commit the engines' code was read at (each records HEAD at its start), named with HEAD's
    if a commit landed while they ran; None (HEAD's) for results from before engines recorded it."""
    started = sorted({results[e]["commit"] for e in engines if "commit" in results[e]})
    if not started:
        return None
    now = provenance.git_commit()
    return ", ".join(started) + ("" if started == [now] else f" at the start (HEAD {now} at the report)")


def report(args, argv, results, wall):
    """The markdown report of one invocation."""
    engines = [e for e in ENGINES if e in results]
    versions = results[engines[0]]["versions"]
    torch_version = results.get("torch", {}).get("versions", {}).get("torch")
    machine = f"{provenance.cpu_model()}, numpy {versions['numpy']}" + (f", torch {torch_version}" if torch_version else "")
    if args.equal_init:
        title = "Engine equality (--equal-init)"
    elif len(engines) == 2:
        title = "Side by side"
    else:
        title = f"{ENGINE_NAMES[engines[0]]} alone, extras {extras_text(results[engines[0]]['extras'])}"
    lines = [f"## {title}: {args.data} {args.src}-{args.tgt}, `{args.preset}`, {args.steps} steps, seed {args.seed}", "",
             provenance.header(shown_command(argv), machine, commit=run_commit(results, engines)) + ".", ""]
    digests = {results[e]["plan_digest"] for e in engines}
    first = results[engines[0]]
    same = "identical on both sides" if len(engines) == 2 and len(digests) == 1 else (
        "DIFFERENT on the two sides" if len(digests) > 1 else "one engine only")
    together = "one after the other" if args.sequential else "both training at the same time"
    threads = (f"one thread per engine, {together}" if len(engines) == 2
               else "one thread (other work on the machine is not recorded here)")
    lines.append(f"Data: {first['plan_batches']} batches of up to {args.max_tokens} padded tokens "
                 f"({first['target_tokens']:,} target tokens), tinyformer's order for seed {args.seed}; batch list "
                 f"sha256 {first['plan_digest'][:16]}, {same}. Joint BPE of {args.vocab_size} pieces (tinyformer's, "
                 f"sha256 {first['tokenizer_sha256'][:12]}). {schedule_text(args)}, label smoothing "
                 f"{args.label_smoothing:g}, Adam (0.9, 0.98, 1e-9); {threads}.")
    if args.equal_init and "tinyformer-ulp" in engines:
        lines.append("Equal init, the control: tinyformer against itself with every initial weight moved one unit "
                     "in the last place (float32 nextafter towards +inf); dropout 0 everywhere.")
    elif args.equal_init:
        lines.append("Equal init: PyTorch starts from tinyformer's initial weights; dropout 0 everywhere.")
    if (same_lr := lr_check(results, engines)) is not None:
        lines.append(same_lr)
    lines.append("")
    header = ["engine", "extras", "parameters", "loss, first step", "loss, last step", "median step s",
              "training min"]
    if args.score:
        header += ["validation NLL", "BLEU", "decoding s"]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for e in engines:
        r = results[e]
        row = [ENGINE_NAMES[e], extras_text(r["extras"]), f"{r['params']:,}", f"{r['losses'][0]:.4f}",
               f"{r['losses'][-1]:.4f}", f"{statistics.median(r['seconds']):.3f}", f"{sum(r['seconds']) / 60:.1f}"]
        if args.score:
            row += [f"{r['valid_nll']:.4f}" if "valid_nll" in r else "", f"**{r['bleu']:.2f}**",
                    f"{r['decode_seconds']:.0f}"]
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    if len(engines) == 2:
        (a, tf), (b, pt) = ((e, results[e]) for e in engines)
        a, b = ENGINE_NAMES[a], ENGINE_NAMES[b]
        ratio = statistics.median(tf["seconds"]) / statistics.median(pt["seconds"])
        lines.append(f"Step time ratio {a} / {b} (medians): **{ratio:.2f}x**. "
                     f"Parameters: {a} {tf['params']:,}, {b} {pt.get('torch_params', pt['params']):,}.")
        if args.score:
            lines.append(f"BLEU difference {b} - {a}: {pt['bleu'] - tf['bleu']:+.2f} "
                         f"({tf['sentences']} sentences of {'test_2016_flickr' if args.data == 'multi30k' else 'test'}, "
                         f"beam {args.beam}, alpha {args.alpha:g}, tinyformer's decoder for both; {tf['signature']}).")
        lines.append("")
        rel = relative_differences(tf["losses"], pt["losses"])
        lines += [f"| steps | {a} mean loss | {b} mean loss | largest relative difference |",
                  "|---|---:|---:|---:|"]
        for lo, hi in windows(len(rel), args.window):
            lines.append(f"| {lo}-{hi} | {numpy.mean(tf['losses'][lo - 1:hi]):.4f} | "
                         f"{numpy.mean(pt['losses'][lo - 1:hi]):.4f} | {rel[lo - 1:hi].max():.2e} |")
        lines.append("")
        lines.append(f"Relative difference: |loss_A - loss_B| / loss_B of the same step ({a}, {b}); "
                     f"largest over all {len(rel)} steps {rel.max():.2e} (step {int(rel.argmax()) + 1}), "
                     f"at step 1 {rel[0]:.2e}.")
    else:
        r = results[engines[0]]
        lines += ["| steps | mean loss |", "|---|---:|"]
        for lo, hi in windows(len(r["losses"]), args.window):
            lines.append(f"| {lo}-{hi} | {numpy.mean(r['losses'][lo - 1:hi]):.4f} |")
    if getattr(args, "val_every", 0) and all(results[e].get("validations") for e in engines):
        lines += ["", "### Validation NLL by step", ""] + validation_section(results, engines, threads) + [""]
    lines.append(f"Wall time of the invocation: {wall / 60:.1f} min.")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- main
def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", choices=("multi30k", "synthetic"), default="multi30k")
    parser.add_argument("--src", default="en")
    parser.add_argument("--tgt", default="de")
    parser.add_argument("--data-dir", help="folder holding multi30k/ (default: $TINYFORMER_DATA, as tinyformer train)")
    parser.add_argument("--preset", default="small")
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--seed", type=int, default=0, help="initialisation, data order and dropout (default 0)")
    parser.add_argument("--vocab-size", type=int, help="joint BPE pieces (default: tinyformer train's for the data)")
    parser.add_argument("--max-tokens", type=int, help="padded tokens per batch (default: tinyformer train's)")
    parser.add_argument("--warmup-steps", type=int, help="Noam warm-up (default: tinyformer train's, 800 for Multi30k)")
    parser.add_argument("--lr-factor", type=float, default=1.0, help="Noam factor; with --schedule linear, its peak "
                        "lr_factor * d_model^-0.5 * warmup^-0.5 is the linear schedule's (default 1)")
    parser.add_argument("--schedule", choices=("noam", "linear"), default="noam", help="noam (default): warm-up, "
                        "then 1/sqrt(step); linear: warm-up to the Noam peak, then linear decay to 0 at --steps "
                        "(the step-count twin of tinyformer train --schedule time)")
    parser.add_argument("--decay-fraction", type=float, default=1.0, help="--schedule linear: the last fraction of "
                        "the steps over which lr falls to 0, in (0, 1] (default 1: from the start)")
    parser.add_argument("--val-every", type=int, default=0, help="the validation NLL (no smoothing, dropout off) "
                        "of both engines every N steps, at the last and before the first; the report's wall time "
                        "to the same validation NLL (default 0: none)")
    parser.add_argument("--label-smoothing", type=float, default=0.1)
    parser.add_argument("--dropout", type=float, help="residual/embedding dropout p, also the extras' p "
                        "(default: the preset's)")
    parser.add_argument("--tf-extras", default="preset", help="tinyformer's extras: preset (the preset's own, "
                        f"default), none (the paper's model), all, or of {', '.join(EXTRAS)}")
    parser.add_argument("--torch-extras", help="PyTorch's extras (default: all, stock nn.Transformer; with "
                        "--equal-init: tinyformer's)")
    parser.add_argument("--equal-init", action="store_true", help="engine equality: PyTorch from tinyformer's "
                        "initial weights, no dropout, the same extras")
    parser.add_argument("--engines", default="tinyformer,torch", help="which to train (default both)")
    parser.add_argument("--sequential", action="store_true", help="train the engines one after the other")
    parser.add_argument("--no-score", dest="score", action="store_false", help="skip the test decoding")
    parser.add_argument("--limit", type=int, help="score only the first N test sentences")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--alpha", type=float, default=0.6)
    parser.add_argument("--window", type=int, default=100, help="steps per row of the loss table (default 100)")
    parser.add_argument("--log-every", type=int, default=50)
    parser.add_argument("--save-every", type=int, default=100, help="save each engine's training state in --work "
                        "every N steps; run the same command again to continue an interrupted one (0: never)")
    parser.add_argument("--work", default=os.path.join("runs", "bench-quality"))
    parser.add_argument("--report", help="append the markdown report to this file")
    parser.add_argument("--skip-done", action="store_true", help="an engine whose result is in --work already is "
                        "not trained again (an invocation with all of them is skipped, its report not appended again)")
    parser.add_argument("--child", choices=ENGINES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    from tinyformer.model.nn.presets import check_preset
    from tinyformer.translation.train.config import OPTIONS

    args.vocab_size = args.vocab_size or OPTIONS["vocab_size"].per_data[args.data]
    args.max_tokens = args.max_tokens or OPTIONS["max_tokens"].per_data[args.data]
    args.warmup_steps = args.warmup_steps or OPTIONS["warmup_steps"].per_data[args.data]
    try:
        check_preset(args.preset)
    except ValueError as error:
        parser.error(f"--preset: {error}")
    try:
        own = args.tf_extras.strip() == "preset"
        args.tf_extras = preset_extras(args.preset) if own else parse_extras(args.tf_extras)
        torch_extras = None if args.torch_extras is None else parse_extras(args.torch_extras)
        args.engines = tuple(e for e in ENGINES if e in parse_list(args.engines, ENGINES))
    except ValueError as error:
        parser.error(str(error))
    if args.equal_init:
        if torch_extras is not None and torch_extras != args.tf_extras:
            parser.error("--equal-init: both engines have the same extras (give --tf-extras only)")
        torch_extras = args.tf_extras
    args.torch_extras = EXTRAS if torch_extras is None else torch_extras
    if args.steps < 1 or args.window < 1 or args.log_every < 1 or args.save_every < 0 or args.val_every < 0:
        parser.error("--steps, --window and --log-every must be positive, --save-every and --val-every 0 or more")
    if not 0 < args.decay_fraction <= 1:
        parser.error(f"--decay-fraction must be in (0, 1], got {args.decay_fraction:g}")
    if args.schedule != "linear" and args.decay_fraction != 1:
        parser.error(f"--decay-fraction {args.decay_fraction:g} shapes --schedule linear only, not noam")
    return args


def parse_list(text, known):
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise ValueError(f"--engines: {', '.join(unknown) or 'none given'}; known: {', '.join(known)}")
    return names


def run_label(args):
    from tinyformer.translation.train.config import OPTIONS

    equal = "-equal" if args.equal_init else ""
    if args.schedule == "linear":
        recipe = f"-linear_w{args.warmup_steps}_f{args.lr_factor:g}_d{args.decay_fraction:g}"
    else:  # Noam's warm-up and factor, named only when they are not tinyformer train's defaults
        default = (OPTIONS["warmup_steps"].per_data[args.data], 1.0)
        given = (args.warmup_steps, args.lr_factor)
        recipe = "" if given == default else f"-noam_w{args.warmup_steps}_f{args.lr_factor:g}"
    val = f"-val{args.val_every}" if args.val_every else ""
    # Options a recipe sweep varies, named only when they differ from tinyformer train's defaults
    # (so that the names of earlier runs stay as they were).
    dropout = f"-drop{args.dropout:g}" if args.dropout is not None else ""
    tokens = f"-tok{args.max_tokens}" if args.max_tokens != OPTIONS["max_tokens"].per_data[args.data] else ""
    return (f"{args.data}-{args.preset}-s{args.seed}-n{args.steps}-tf_{extras_text(args.tf_extras)}"
            f"-torch_{extras_text(args.torch_extras)}{equal}{recipe}{val}{dropout}{tokens}").replace(",", "+")


def result_path(args, engine):
    """Where ``engine``'s child writes its result (a JSON file) when it has trained and scored."""
    return Path(args.work) / "results" / f"{run_label(args)}-{engine}.json"


def child_main(args):
    out = result_path(args, args.child)
    result = run_engine(args, args.child, log=lambda line: print(line, flush=True))
    out.write_text(json.dumps(result), encoding="utf-8")
    return 0


def prepare_tokenizer(args):
    """The shared tokenizer (trained once, here, before the engines start and load it; invocations
    started together over one --work wait for the first to train it)."""
    from tinyformer.common.filecache import locked
    from tinyformer.translation.train.builders import build_tokenizer, load_corpus

    config = run_config(args, "tinyformer")
    Path(config.save_dir).mkdir(parents=True, exist_ok=True)
    with locked(Path(config.save_dir) / "spm.lock"):
        text = None if (Path(config.save_dir) / "spm.model").exists() else load_corpus(config, "train")
        return build_tokenizer(config, text, echo=lambda line: print(line, flush=True))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if args.child:
        return child_main(args)
    start = time.perf_counter()
    (Path(args.work) / "results").mkdir(parents=True, exist_ok=True)
    prepare_tokenizer(args)
    env = dict(os.environ, **{name: "1" for name in THREAD_VARIABLES})
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    label = run_label(args)
    logs = {e: Path(args.work) / "results" / f"{label}-{e}.log" for e in args.engines}
    finished = {e for e in args.engines if args.skip_done and result_path(args, e).exists()}
    if finished == set(args.engines):
        print(f"bench_quality: done already ({', '.join(str(result_path(args, e)) for e in args.engines)})")
        return 0
    running = {}
    for engine in args.engines:
        if engine in finished:
            print(f"{engine}: done already, its result read from {result_path(args, engine)}", flush=True)
            continue
        with open(logs[engine], "a" if args.save_every else "w", encoding="utf-8") as log:
            print(f"{engine}: training, log in {logs[engine]}", flush=True)
            running[engine] = subprocess.Popen([sys.executable, os.path.abspath(__file__), *argv, "--child", engine],
                                               stdout=log, stderr=subprocess.STDOUT, env=env)
        if args.sequential:
            running[engine].wait()
    failed = [e for e, process in running.items() if process.wait() != 0]
    for engine in running:
        print(logs[engine].read_text(encoding="utf-8").rstrip(), flush=True)
    if failed:
        raise SystemExit(f"bench_quality: {', '.join(failed)} failed (see the log above)")
    results = {e: json.loads(result_path(args, e).read_text(encoding="utf-8")) for e in args.engines}
    text = report(args, argv, results, time.perf_counter() - start)
    print(text)
    if args.report:
        with open(args.report, "a", encoding="utf-8") as f:
            f.write("\n" + text)
    if len({r["plan_digest"] for r in results.values()}) > 1:
        raise SystemExit("bench_quality: the engines were given different batch lists")
    return 0


if __name__ == "__main__":
    sys.exit(main())
