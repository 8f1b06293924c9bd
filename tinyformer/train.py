"""Training a translation model the paper's way (§5): token-count batches, label smoothing,
Adam with warm-up, periodic validation, atomic checkpoints, exact resume.

``Trainer(TrainConfig(...)).run()`` is what ``tinyformer train`` calls. Everything a
run needs to continue exactly — parameters, Adam's moments and step, the dropout
generator's state, the position in the epoch — is in each checkpoint, so
``--resume`` on the CPU repeats the uninterrupted run's losses.

Failures lose nothing: an update whose loss or gradient is not finite is skipped
(``max_bad_steps`` in a row stop the run); Ctrl-C stops at once in a forward or
backward pass or a validation, but lets an update, its log record and a checkpoint
write finish, then saves the last completed step and raises ``TrainingInterrupted``;
a process killed at any point (SIGKILL) leaves checkpoints that load and resume exactly.
"""

import contextlib
import dataclasses
import json
import math
import os
import signal
import threading
import time
from pathlib import Path

from . import backend, checkpoint, decode, metrics
from . import functional as F
from . import random as tf_random
from .data import PAD_ID
from .data.batching import ParallelData
from .nn import StateDictError, Transformer, TransformerConfig
from .nn.presets import PRESETS
from .optim import Adam, NoamSchedule
from .tensor import no_grad
from .validation import check_int

__all__ = ["TrainConfig", "Trainer", "TrainingDiverged", "TrainingInterrupted", "DATASETS", "load_corpus",
           "load_model"]

DATASETS = ("synthetic", "multi30k")
TOKENIZER_FILE = "spm.model"
LOG_FILE = "metrics.jsonl"


@dataclasses.dataclass
class TrainConfig:
    """Everything that defines a run; saved in every checkpoint. ``None`` means "the data's default"."""

    data: str = "synthetic"
    src_lang: str = "en"
    tgt_lang: str = "de"
    data_dir: str = None
    preset: str = None
    vocab_size: int = None
    max_tokens: int = None
    accum: int = 1
    max_steps: int = None
    max_epochs: int = None
    warmup_steps: int = None
    lr_factor: float = None
    label_smoothing: float = 0.1  # §5.4: ε_ls = 0.1 hurts perplexity, helps accuracy and BLEU
    dropout: float = None
    model_overrides: dict = None  # Transformer arguments over the preset's: {"heads": 8, "positional": "learned"}
    max_len: int = 256
    max_grad_norm: float = None
    max_bad_steps: int = 5  # stop after this many updates in a row skipped for a non-finite loss or gradient
    seed: int = 0
    threads: int = None
    device: str = "cpu"
    save_dir: str = "runs/synthetic-tiny"
    save_every: int = None
    keep_last: int = 5
    eval_every: int = None
    log_every: int = 10
    bleu_samples: int = 500
    beam_size: int = 4
    alpha: float = 0.6

    DEFAULTS = {
        # The built-in task: `tiny` reaches >= 95% exact match in a few CPU minutes.
        # One BLAS thread: its matrices are too small to gain from more, and spinning BLAS
        # threads slow down many-fold on a machine whose other core is busy.
        "synthetic": dict(preset="tiny", vocab_size=600, max_tokens=2048, max_steps=1000,
                          warmup_steps=200, lr_factor=1.0, save_every=500, eval_every=500, threads=1),
        # Multi30k (§5 scaled down): joint BPE 8k, ~4,096 tokens per batch, warm-up 800.
        "multi30k": dict(preset="small", vocab_size=8000, max_tokens=4096, max_steps=3000,
                         warmup_steps=800, lr_factor=1.0, save_every=500, eval_every=500),
    }

    def resolved(self):
        """A copy with every ``None`` default filled in for the chosen data, validated."""
        if self.data not in DATASETS:
            raise ValueError(f"data must be one of {DATASETS}, got {self.data!r}")
        values = dataclasses.asdict(self)
        for key, value in self.DEFAULTS[self.data].items():
            if values[key] is None:
                values[key] = value
        config = TrainConfig(**values)
        if config.preset not in PRESETS:
            raise ValueError(f"unknown preset {config.preset!r}; known presets: {', '.join(PRESETS)}")
        for name in ("vocab_size", "max_tokens", "accum", "max_steps", "warmup_steps", "max_len",
                     "save_every", "eval_every", "log_every", "beam_size", "max_bad_steps"):
            check_int(name, getattr(config, name), 1)
        if config.src_lang == config.tgt_lang:
            raise ValueError(f"source and target language are both {config.src_lang!r}")
        _check_model_overrides(config.model_overrides)
        backend.check_device(config.device)
        return config

    def to_dict(self):
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values):
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})


class TrainingDiverged(FloatingPointError):
    """``max_bad_steps`` updates in a row had a non-finite loss or gradient; nothing bad was saved."""


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped training; ``checkpoint`` is the checkpoint of the last completed step (or None)."""

    def __init__(self, message, checkpoint=None):
        super().__init__(message)
        self.checkpoint = checkpoint


# Transformer arguments a run sets from its own fields (or the tokenizer), never through model_overrides.
_RUN_SET = {"src_vocab_size": "vocab_size", "tgt_vocab_size": "vocab_size", "pad_id": None,
            "label_smoothing": "label_smoothing", "dropout": "dropout", "max_len": "max_len", "seed": "seed"}


def _check_model_overrides(overrides):
    """``model_overrides``: None or a dict of Transformer arguments that change the preset's model."""
    if overrides is None:
        return
    if not isinstance(overrides, dict):
        raise ValueError(f"model_overrides must be a dict of Transformer arguments, got {overrides!r}")
    allowed = sorted(set(TransformerConfig.field_names()) - set(_RUN_SET))
    for key in overrides:
        if key in _RUN_SET:
            field = _RUN_SET[key]
            raise ValueError(f"model_overrides: {key!r} is set by the run"
                             + (f"; use TrainConfig.{field}" if field else ""))
        if key not in allowed:
            raise ValueError(f"model_overrides: unknown Transformer argument {key!r}; allowed: {', '.join(allowed)}")


@contextlib.contextmanager
def blas_threads(count):
    """A context that limits the BLAS (matrix product) threads, and tinyformer's own threads for
    large row-wise work (``backend.set_num_threads``), to ``count``; None leaves them alone."""
    if count is None:
        yield
        return
    from threadpoolctl import threadpool_limits

    old = backend.set_num_threads(count)
    try:
        with threadpool_limits(limits=count, user_api="blas"):
            yield
    finally:
        backend.set_num_threads(old)


def load_corpus(config, split):
    """(source lines, target lines) of ``split`` ("train", "val" or "test") for the configured data."""
    if config.data == "synthetic":
        from .data.synthetic import synthetic_pairs

        if (config.src_lang, config.tgt_lang) not in (("en", "de"), ("de", "en")):
            raise ValueError("the synthetic task is English-German: use --src en --tgt de (or the reverse)")
        english, german = synthetic_pairs(split, seed=0)
        return (english, german) if config.src_lang == "en" else (german, english)
    from .data.multi30k import load_multi30k

    name = {"train": "train", "val": "val", "test": "test_2016_flickr"}[split]
    return load_multi30k(name, config.src_lang, config.tgt_lang, data_dir=config.data_dir)


def load_model(path, device="cpu", tokenizer_path=None):
    """(model in eval mode, tokenizer, metadata) from a checkpoint.

    Refuses (CheckpointError naming the file and the mismatch) a file ``load_checkpoint``
    refuses, a tokenizer other than the run's, and parameters that do not fit the checkpoint's
    own ``model_config``.
    """
    from .data.tokenizer import Tokenizer

    state, meta, _ = checkpoint.load_checkpoint(path)
    model_config = meta.get("model_config")
    if not isinstance(model_config, dict):
        raise checkpoint.CheckpointError(f"checkpoint {path} has no model_config in its metadata: it was not "
                                         "written by tinyformer train (or averaged from such checkpoints)")
    tokenizer_path = Path(tokenizer_path) if tokenizer_path else Path(path).parent / TOKENIZER_FILE
    tokenizer = Tokenizer.load(tokenizer_path)
    expected = meta.get("tokenizer_sha256")
    vocab = model_config.get("src_vocab_size")
    if expected != tokenizer.sha256:
        raise checkpoint.CheckpointError(
            f"tokenizer {tokenizer_path} (sha256 {tokenizer.sha256[:12]}..., {len(tokenizer)} pieces) is not "
            f"the one checkpoint {path} was trained with (sha256 {str(expected)[:12]}..., vocabulary {vocab}): "
            f"pass the run's {TOKENIZER_FILE}"
        )
    for key in ("src_vocab_size", "tgt_vocab_size"):
        size = model_config.get(key)
        if size is not None and size != len(tokenizer):
            raise checkpoint.CheckpointError(f"checkpoint {path}: its model's {key} is {size}, but tokenizer "
                                             f"{tokenizer_path} has {len(tokenizer)} pieces")
    try:
        model = Transformer.from_config(TransformerConfig.from_dict(model_config))
    except (TypeError, ValueError) as error:
        raise checkpoint.CheckpointError(f"checkpoint {path}: its model_config cannot be built ({error})") from None
    summary = ", ".join(f"{k} {model_config.get(k)}" for k in ("d_model", "d_ff", "heads", "num_layers"))
    _load_state(model, state, f"checkpoint {path}: its parameters do not fit its model_config ({summary})")
    return model.to(device).eval(), tokenizer, meta


def _load_state(model, state, context):
    """``model.load_state_dict(state)``; a mismatch becomes a one-line CheckpointError starting with
    ``context`` and naming the first of each kind of disagreement."""
    try:
        model.load_state_dict(state)
    except StateDictError as error:
        shapes = [f"{k} is {saved}, not {shape}" for k, saved, shape in error.mismatched]
        missing = [f"{k} is missing" for k in error.missing]
        unexpected = [f"{k} is not a parameter of the model" for k in error.unexpected]
        parts = [group[0] + (f" (and {len(group) - 1} more like it)" if len(group) > 1 else "")
                 for group in (shapes, missing, unexpected) if group]
        raise checkpoint.CheckpointError(f"{context}: {'; '.join(parts)}") from None


class Trainer:
    """Runs one training job: data, tokenizer, model, optimiser, the loop, checkpoints, evaluation."""

    def __init__(self, config, resume=False, echo=print, progress=True):
        self.config = config.resolved()
        self.resume, self.echo, self.progress = resume, echo, progress
        self.save_dir = Path(self.config.save_dir)
        self.step = self.epoch = self.batch_in_epoch = 0
        self.tokens_seen = 0
        self.skipped_updates = 0  # updates skipped for a non-finite loss or gradient, over the whole run
        self.bad_in_a_row = 0
        self._boundary_rng = None     # the dropout generator's state before the forward pass in progress
        self._interruptible = 0       # > 0 where Ctrl-C may stop at once (forward, backward, validation)
        self._pending_interrupt = False
        self._forced_interrupt = False

    # ------------------------------------------------------------------ setup
    def setup(self):
        from .data.tokenizer import Tokenizer

        c = self.config
        existing = checkpoint.list_checkpoints(self.save_dir)
        if existing and not self.resume:
            raise FileExistsError(
                f"{self.save_dir} already holds checkpoints (newest {existing[-1].name}): pass --resume "
                "to continue that run, or choose another --save-dir"
            )
        if self.resume and not existing:
            raise FileNotFoundError(f"--resume: no checkpoint_*.npz in {self.save_dir}")
        if self.resume:
            partial = checkpoint.remove_partial_files(self.save_dir)
            if partial:
                self.echo(f"removed {len(partial)} partial checkpoint file(s) left by an interrupted save")
        self.save_dir.mkdir(parents=True, exist_ok=True)
        self.train_text = load_corpus(c, "train")
        self.val_text = load_corpus(c, "val")
        tokenizer_path = self.save_dir / TOKENIZER_FILE
        if tokenizer_path.exists():
            self.tokenizer = Tokenizer.load(tokenizer_path)
        else:
            self.echo(f"training a joint BPE tokenizer ({c.vocab_size} pieces) on "
                      f"{len(self.train_text[0]):,} sentence pairs")
            self.tokenizer = Tokenizer.train(self.train_text[0] + self.train_text[1], self.save_dir,
                                             vocab_size=c.vocab_size, name=tokenizer_path.stem)
        self.train_data = self._encode(self.train_text)
        self.val_data = self._encode(self.val_text)
        if self.train_data.num_dropped:
            self.echo(f"dropped {self.train_data.num_dropped} training pairs longer than {c.max_len} tokens")
        overrides = {} if c.dropout is None else {"dropout": c.dropout}
        overrides.update(c.model_overrides or {})
        tf_random.manual_seed(c.seed)
        self.model = Transformer.from_preset(
            c.preset, vocab_size=len(self.tokenizer), pad_id=PAD_ID, max_len=max(c.max_len, 1024), seed=c.seed,
            **overrides,
        ).to(c.device)
        self.schedule = NoamSchedule(self.model.d_model, c.warmup_steps, c.lr_factor)
        self.adam = Adam(self.model.parameters(), lr=self.schedule, max_grad_norm=c.max_grad_norm)
        if self.resume:
            self._restore(existing[-1])
        self.echo(f"model: {c.preset} ({self.model.extra_repr()}), {self.model.num_parameters():,} "
                  f"parameters; {len(self.train_data):,} training pairs, "
                  f"{self.train_data.num_target_tokens:,} target tokens per epoch")

    def _encode(self, text):
        src, tgt = text
        return ParallelData(self.tokenizer.encode_batch(src), self.tokenizer.encode_batch(tgt),
                            max_len=self.config.max_len)

    # ------------------------------------------------------------------ checkpoints
    def metadata(self):
        return {
            "format": "tinyformer-checkpoint-1",
            "config": self.config.to_dict(),
            "model_config": self.model.config,
            "step": self.step,
            "epoch": self.epoch,
            "batch_in_epoch": self.batch_in_epoch,
            "tokens_seen": self.tokens_seen,
            "skipped_updates": self.skipped_updates,
            "rng_state": tf_random.get_rng_state(),
            "tokenizer_sha256": self.tokenizer.sha256,
            "tokenizer_file": TOKENIZER_FILE,
            "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
        }

    def save(self):
        """Checkpoint the current step (a Ctrl-C waits until it and the pruning are done)."""
        path = checkpoint.checkpoint_path(self.save_dir, self.step)
        checkpoint.save_checkpoint(path, self.model.state_dict(), self.metadata(), self.adam.state_dict())
        checkpoint.prune_checkpoints(self.save_dir, self.config.keep_last)
        return path

    def _restore(self, path):
        state, meta, adam_state = checkpoint.load_checkpoint(path)
        if meta.get("tokenizer_sha256") != self.tokenizer.sha256:
            raise checkpoint.CheckpointError(f"{path} was trained with another tokenizer than {self.save_dir / TOKENIZER_FILE}")
        differences = checkpoint.model_config_mismatch(meta.get("model_config") or {}, self.model.config)
        if differences:
            raise checkpoint.CheckpointError(
                f"{path} holds another model than this run builds ({'; '.join(differences)}; checkpoint vs "
                "run): resume with the run's own settings (tinyformer train --resume reads them from the checkpoint)")
        _load_state(self.model, state, f"{path}: its parameters do not fit its model_config")
        if adam_state is None:
            raise checkpoint.CheckpointError(f"{path} holds no optimiser state (an averaged checkpoint?): cannot resume from it")
        self.adam.load_state_dict(adam_state)
        self.adam.lr = self.schedule
        self.step, self.epoch = meta["step"], meta["epoch"]
        self.batch_in_epoch, self.tokens_seen = meta["batch_in_epoch"], meta["tokens_seen"]
        self.skipped_updates = meta.get("skipped_updates", 0)
        tf_random.set_rng_state(meta["rng_state"])
        self._truncate_log(self.step)
        self.echo(f"resumed from {path.name} at step {self.step} (epoch {self.epoch + 1}, batch {self.batch_in_epoch})")

    def _truncate_log(self, step):
        """Drop the metrics logged after ``step`` by the run that stopped (and a torn last line):
        the resumed run logs those steps again, so the log reads as one uninterrupted run."""
        log = self.save_dir / LOG_FILE
        if not log.exists():
            return
        kept, dropped = [], 0
        for line in log.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                dropped += 1
                continue
            if isinstance(record, dict) and record.get("step", 0) > step:
                dropped += 1
            else:
                kept.append(line)
        if dropped:
            partial = log.with_name(LOG_FILE + ".tmp")
            partial.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
            os.replace(partial, log)
            self.echo(f"{LOG_FILE}: dropped {dropped} record(s) logged after step {step} by the interrupted run")

    # ------------------------------------------------------------------ the loop
    def log(self, record):
        with open(self.save_dir / LOG_FILE, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")

    def train_step(self, batches):
        """One optimiser step over ``batches`` (gradient accumulation); returns (loss, nll, tokens, grad_norm).

        The position in the data moves past ``batches`` in any case. The update is skipped
        (parameters, Adam's moments and the step count unchanged) when the loss is not finite
        (``grad_norm`` is then None) or the gradient norm is not finite.
        """
        tokens = sum(b.num_tokens for b in batches)
        total_loss = total_nll = 0.0
        self._boundary_rng = tf_random.get_rng_state()
        with self._interrupts_allowed():  # nothing of the run's state changes until the update below
            self.adam.zero_grad()
            for batch in batches:
                logits = self.model(batch.src, batch.tgt_in, src_mask=batch.src_mask)
                loss, nll = F.cross_entropy(logits, batch.tgt_out, self.config.label_smoothing,
                                            ignore_index=PAD_ID, reduction="sum", return_nll=True)
                (loss * (1.0 / tokens)).backward()
                total_loss += loss.item()
                total_nll += nll.item()
        self._boundary_rng = None
        loss, nll = total_loss / tokens, total_nll / tokens
        grad_norm = self.adam.step(skip_nonfinite=True) if math.isfinite(loss) else None
        self.batch_in_epoch += len(batches)
        if grad_norm is not None and math.isfinite(grad_norm):
            self.step += 1
            self.tokens_seen += tokens
        return loss, nll, tokens, grad_norm

    def run(self):
        """Train until ``max_steps`` (or ``max_epochs``), then save; returns the last validation record.

        Raises TrainingDiverged after ``max_bad_steps`` skipped updates in a row (no checkpoint
        written), TrainingInterrupted on Ctrl-C (after checkpointing the last completed step).
        """
        self._pending_interrupt = self._forced_interrupt = False
        with blas_threads(self.config.threads), self._interrupt_handler():
            return self._run()

    def _run(self):
        c = self.config
        with self._interrupts_allowed():
            self.setup()
        bar = None
        if self.progress:
            from tqdm import tqdm

            bar = tqdm(total=c.max_steps, initial=self.step, unit="step", dynamic_ncols=True)
        try:
            last_val = self._loop(bar)
            if self._newest_checkpoint() != checkpoint.checkpoint_path(self.save_dir, self.step):
                self.save()  # a run that max_epochs ended between two saves
            self._interruption_point()
        except KeyboardInterrupt:
            if bar is not None:
                bar.close()
            raise self._save_on_interrupt() from None
        finally:
            if bar is not None:
                bar.close()
        return last_val

    def _loop(self, bar):
        c = self.config
        last_val = None
        window_tokens, window_start = 0, time.perf_counter()
        self.model.train()
        while self.step < c.max_steps and (c.max_epochs is None or self.epoch < c.max_epochs):
            batches = self.train_data.batches(c.max_tokens, seed=c.seed, epoch=self.epoch)
            while self.batch_in_epoch < len(batches) and self.step < c.max_steps:
                self._interruption_point()
                group = batches[self.batch_in_epoch:self.batch_in_epoch + c.accum]
                step_before = self.step
                loss, nll, tokens, grad_norm = self.train_step(group)
                if self.step == step_before:
                    self._skipped(loss, grad_norm, bar)
                    continue
                self.bad_in_a_row = 0
                window_tokens += tokens
                if self.step % c.log_every == 0 or self.step == 1:
                    elapsed = time.perf_counter() - window_start
                    record = {"step": self.step, "epoch": self.epoch + 1, "loss": round(loss, 5),
                              "nll": round(nll, 5), "ppl": round(math.exp(min(nll, 50)), 4),
                              "lr": self.adam.current_lr(self.step), "grad_norm": round(grad_norm, 5),
                              "tokens_per_s": round(window_tokens / max(elapsed, 1e-9), 1),
                              "skipped_updates": self.skipped_updates}
                    self.log(record)
                    window_tokens, window_start = 0, time.perf_counter()
                    if bar is not None:
                        bar.set_postfix(self._postfix(loss=f"{loss:.3f}", lr=f"{record['lr']:.2e}",
                                                      tok_s=f"{record['tokens_per_s']:.0f}"))
                if bar is not None:
                    bar.update(1)
                if self.step % c.eval_every == 0 or self.step == c.max_steps:
                    self._interruption_point()
                    with self._interrupts_allowed():
                        last_val = self.validate()
                    self.model.train()
                if self.step % c.save_every == 0 or self.step == c.max_steps:
                    self.save()
            if self.batch_in_epoch >= len(batches):
                self.epoch += 1
                self.batch_in_epoch = 0
        return last_val

    def _postfix(self, **values):
        if self.skipped_updates:
            values["skipped"] = self.skipped_updates
        return values

    def _skipped(self, loss, grad_norm, bar):
        """Count an update skipped for a non-finite loss or gradient; stop after ``max_bad_steps`` in a row."""
        self.skipped_updates += 1
        self.bad_in_a_row += 1
        reason = (f"non-finite loss ({loss})" if grad_norm is None
                  else f"non-finite gradient norm ({grad_norm}) at loss {loss:.4g}")
        self.log({"step": self.step + 1, "epoch": self.epoch + 1, "skipped": reason,
                  "skipped_updates": self.skipped_updates, "bad_in_a_row": self.bad_in_a_row})
        note = (f"step {self.step + 1}: update skipped, {reason} ({self.bad_in_a_row} in a row, "
                f"{self.skipped_updates} in all)")
        if bar is not None:
            bar.set_postfix(self._postfix(last=reason.split(" (")[0]))
            bar.write(note)
        else:
            self.echo(note)
        if self.bad_in_a_row >= self.config.max_bad_steps:
            kept = self._kept_note(self._newest_checkpoint())
            raise TrainingDiverged(
                f"training stopped: {self.bad_in_a_row} updates in a row were skipped for a non-finite loss "
                f"or gradient (max_bad_steps={self.config.max_bad_steps}; the last: {reason} at step "
                f"{self.step + 1}); none was applied or saved and {kept}; try a lower --lr-factor or a "
                "--max-grad-norm in a new run"
            )

    # ------------------------------------------------------------------ Ctrl-C
    @contextlib.contextmanager
    def _interrupt_handler(self):
        """While training, Ctrl-C stops at once inside ``_interrupts_allowed`` sections (forward and
        backward passes, validation, setup) and at the next ``_interruption_point`` elsewhere, so an
        update, its counters and log record, and a checkpoint write are never cut in two. A second
        Ctrl-C while one is pending stops at once, saving nothing."""
        if threading.current_thread() is not threading.main_thread() \
                or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
            yield
            return

        def on_sigint(signum, frame):
            if self._interruptible:
                raise KeyboardInterrupt
            if self._pending_interrupt:
                self._forced_interrupt = True
                raise KeyboardInterrupt
            self._pending_interrupt = True

        signal.signal(signal.SIGINT, on_sigint)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, signal.default_int_handler)

    @contextlib.contextmanager
    def _interrupts_allowed(self):
        """A section that Ctrl-C may cut short: it changes nothing a checkpoint holds."""
        self._interruption_point()
        self._interruptible += 1
        try:
            yield
        finally:
            self._interruptible -= 1

    def _interruption_point(self):
        if self._pending_interrupt:
            raise KeyboardInterrupt

    def _newest_checkpoint(self):
        newest = checkpoint.list_checkpoints(self.save_dir)[-1:]
        return newest[0] if newest else None

    @staticmethod
    def _kept_note(newest):
        return f"the last checkpoint, {newest}, is intact" if newest else "no checkpoint was written"

    def _save_on_interrupt(self):
        """A TrainingInterrupted naming the checkpoint of the last completed step, saved if need be."""
        self._interruptible, self._pending_interrupt = 0, True  # a further Ctrl-C forces, saving nothing
        newest = self._newest_checkpoint()
        if self._forced_interrupt:
            message = f"interrupted at step {self.step} before a checkpoint could be saved; {self._kept_note(newest)}"
            self.echo(message)
            return TrainingInterrupted(message, newest)
        if self._boundary_rng is not None:  # undo the dropout draws of a step cut short
            tf_random.set_rng_state(self._boundary_rng)
        path = checkpoint.checkpoint_path(self.save_dir, self.step)
        if newest != path:
            try:
                self.save()
            except (OSError, checkpoint.CheckpointError) as error:
                message = f"interrupted at step {self.step}; saving it failed ({error})"
                self.echo(message)
                return TrainingInterrupted(message, newest)
        message = f"interrupted at step {self.step}, which is saved in {path}; continue with --resume"
        self.echo(message)
        return TrainingInterrupted(message, path)

    # ------------------------------------------------------------------ validation
    @no_grad()
    def validation_loss(self):
        """Label-smoothed loss and perplexity per target token on the validation split (no dropout)."""
        self.model.eval()
        total_loss = total_nll = 0.0
        tokens = 0
        for batch in self.val_data.batches(self.config.max_tokens, shuffle=False):
            logits = self.model(batch.src, batch.tgt_in, src_mask=batch.src_mask)
            loss, nll = F.cross_entropy(logits, batch.tgt_out, self.config.label_smoothing,
                                        ignore_index=PAD_ID, reduction="sum", return_nll=True)
            total_loss += loss.item()
            total_nll += nll.item()
            tokens += batch.num_tokens
        return total_loss / tokens, total_nll / tokens

    def validate(self):
        loss, nll = self.validation_loss()
        n = self.config.bleu_samples
        sources, references = self.val_text[0][:n], self.val_text[1][:n]
        hypotheses = decode.translate(self.model, self.tokenizer, sources, beam_size=1)
        bleu = metrics.corpus_bleu(hypotheses, references)
        exact = sum(h == r for h, r in zip(hypotheses, references)) / max(len(references), 1)
        record = {"step": self.step, "split": "val", "loss": round(loss, 5), "nll": round(nll, 5),
                  "ppl": round(math.exp(min(nll, 50)), 4), "bleu_greedy": round(bleu.score, 2),
                  "exact_match_greedy": round(exact, 4), "bleu_sentences": len(references)}
        self.log(record)
        self.echo(f"step {self.step}: val loss {loss:.3f}, ppl {record['ppl']:.2f}, "
                  f"BLEU {bleu.score:.2f} (greedy, {len(references)} sentences), exact match {exact:.1%}")
        return record


def evaluate(model, tokenizer, sources, references, beam_size=4, alpha=0.6):
    """BLEU (sacreBLEU, and tokenized lowercased) and exact match of the model's translations."""
    hypotheses = decode.translate(model, tokenizer, sources, beam_size=beam_size, alpha=alpha)
    bleu = metrics.corpus_bleu(hypotheses, references)
    tokenized = metrics.tokenized_bleu(hypotheses, references)
    exact = sum(h == r for h, r in zip(hypotheses, references)) / max(len(references), 1)
    return {"bleu": bleu.score, "signature": bleu.signature, "tokenized_bleu": tokenized.score,
            "tokenized_signature": tokenized.signature, "exact_match": exact,
            "sentences": len(references), "hypotheses": hypotheses}
