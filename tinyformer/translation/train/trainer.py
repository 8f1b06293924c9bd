"""The Trainer: the loop over finished parts (built by ``builders.build_parts`` unless handed
over), with validation, checkpoints, skipped updates and Ctrl-C.

Failures lose nothing: an update whose loss or gradient is not finite is skipped
(``max_bad_steps`` in a row stop the run); Ctrl-C stops at once in a forward or backward pass or
a validation, but lets an update, its log record and a checkpoint write finish, then saves the
last completed step and raises ``TrainingInterrupted``.

Several ranks (``comm``, from ``distributed.init``: an MPI launch) train one model: each step's
``nproc × accum`` batches are shared out (rank r takes its consecutive part), the loss is divided
by the target tokens of all of them (summed over the ranks), the gradients are summed in
buckets while the backward pass goes on, and every rank applies the same update. Rank 0 alone
writes (checkpoints, metrics.jsonl, the progress bar) and validates while the others wait; every
``check_every`` steps a checksum confirms that the ranks still hold the same parameters.

Mixed precision (``precision`` bf16 or fp16): the forward and backward passes run under
``amp.autocast``; the parameters and Adam's moments stay float32. In fp16 the loss is scaled
(``optim.GradScaler``) and an update whose gradients overflowed is skipped, halving the scale: it
is logged and counted (``overflow_skipped``), and is no bad step unless the scale falls below
``min_loss_scale``, which stops the run. A batch that does not fit the GPU stops the run with one
line naming ``--max-tokens`` and the memory asked for and free; the last checkpoint stays intact.

Time (``clock``): rank 0's clock, agreed on in each step's collective, ends the run at
``time_limit``, drives ``schedule="time"``'s learning rate and the checkpoints and validations of
``save_every_minutes``/``eval_every_minutes``; ``average_last`` averages the last checkpoints into
averaged.npz when training ends and validates it (``averaged``).
"""

import contextlib
import math
import warnings
from pathlib import Path

import numpy

from ...engine import amp, backend
from .. import checkpoint, distributed
from ...engine import random as tf_random
from .averaging import average_and_load
from .builders import build_parts
from .clock import Every
from .config import ConfigError, flag_of
from . import graphs
from .evaluation import batch_loss, perplexity, translation_scores, validation_loss
from .metrics_log import LOG_FILE, MetricsLog, TokenRate
from .progress import ProgressBar
from .recipes import RECIPES
from .state import Position, run_metadata
from .step_result import StepResult
from .stopping import StoppingRules

__all__ = ["Trainer", "TrainingInterrupted", "TrainingOutOfMemory", "blas_threads"]


class TrainingOutOfMemory(MemoryError):
    """A step's batch did not fit the GPU; the message names --max-tokens and the memory asked for and free."""


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped training; ``checkpoint`` is the checkpoint of the last completed step (or None)."""

    def __init__(self, message, checkpoint=None):
        super().__init__(message)
        self.checkpoint = checkpoint


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


def _position_counter(name):
    return property(lambda self: getattr(self.position, name), doc=f"``position.{name}``")


class Trainer:
    """Runs one training job: ``Trainer(config).run()`` builds the parts (``setup``), trains,
    validates and checkpoints; ``Trainer(config, parts=build_parts(config))`` runs given parts.
    When it stops, and why, is ``stopping`` (``StoppingRules``); each step returns a ``StepResult``."""

    step = _position_counter("step")
    epoch = _position_counter("epoch")
    batch_in_epoch = _position_counter("batch_in_epoch")
    tokens_seen = _position_counter("tokens_seen")
    skipped_updates = _position_counter("skipped_updates")

    def __init__(self, config, resume=False, echo=print, progress=True, parts=None, comm=None):
        self.config = config.resolved()
        c = self.config
        try:
            self.comm = comm if comm is not None else distributed.init(c.comm, c.device, c.comm_timeout)
        except ValueError as error:
            raise ConfigError("comm", str(error)) from None
        if c.nproc is not None and c.nproc != self.comm.size:
            raise ConfigError("nproc", f"nproc is {c.nproc} (the run's), but {self.comm.size} process(es) were started"
                                       + ("; --resume keeps a run's nproc" if resume else ""))
        c.nproc = self.comm.size
        if c.device == "cpu":  # each step's large arrays reuse the last step's memory
            backend.keep_freed_memory()
        self.lead = self.comm.rank == 0  # the one rank that writes, shows and validates
        self.resume, self.echo, self.progress = resume, echo if self.lead else _silent, progress and self.lead
        self.save_dir = Path(self.config.save_dir)
        self.metrics = MetricsLog(self.save_dir / LOG_FILE)
        self.precision = amp.get_precision(c.precision)
        self.stopping = StoppingRules(c, self.comm.size, self.lead, self._checkpoint_note)
        # the parts, from setup() (or handed over)
        self.tokenizer = self.model = self.adam = None
        self.train_data = self.val_data = self.val_text = None
        self.position = Position()
        self.scaler = None            # fp16's loss scale (disabled otherwise)
        self.buckets = None           # the gradient all-reduce, with several ranks
        self._saved_step = None       # the step of the last checkpoint this run wrote or resumed from
        self._boundary_rng = None     # the dropout generator's state before the forward pass in progress
        self.graphs = None            # the captured steps (graphs.GraphedStep) with cuda_graphs "on"
        self.keep = max(c.keep_last, c.average_last or 0)  # checkpoints kept: at least those averaged
        self.averaged = None          # rank 0, average_last: the AveragedModel of the run's end
        self._save_timer = self._eval_timer = Every(None)  # save/eval_every_minutes, from the run's start
        if parts is not None:
            self._take(parts)

    def setup(self):
        """Build the parts from the config (restored from the newest checkpoint on resume), unless
        they were handed over."""
        if self.model is None:
            self._take(build_parts(self.config, self.resume, self.echo, self.comm))

    def _take(self, parts):
        self.config = parts.found_in(self.config)  # with what building found, which checkpoints save
        self.tokenizer, self.model, self.adam = parts.tokenizer, parts.model, parts.adam
        self.train_data, self.val_data, self.val_text = parts.train_data, parts.val_data, parts.val_text
        self.position = parts.position
        self.scaler = parts.scaler
        self._saved_step = self.position.step if self.resume else None
        if self.comm.size > 1:
            self.buckets = distributed.GradientBuckets(self.comm, self.model.parameters(), self.config.bucket_mb)
        if self.config.cuda_graphs == "on":
            self.graphs = self._graphed_step()

    def _graphed_step(self):
        """The GraphedStep of ``cuda_graphs="on"``, or None after one warning naming why not."""
        c, like = self.config, next(iter(self.model.parameters())).data
        try:
            capture = graphs.open_capture(c, self.comm.size, like)
        except backend.CaptureUnavailable as reason:
            warnings.warn(f"--cuda-graphs on: {reason}; the steps run eagerly", RuntimeWarning, stacklevel=3)
            return None
        return graphs.GraphedStep(self.model, self.adam, self.precision, c.label_smoothing, c.max_tokens,
                                  self.model.config.max_len, capture, shape_multiple=c.shape_multiple,
                                  quietly=self._overflow_quietly)

    # ------------------------------------------------------------------ the loop
    def run(self):
        """Train until ``max_steps`` (or ``max_epochs``), then save; returns the last validation record.

        Raises TrainingDiverged after ``max_bad_steps`` skipped updates in a row (no checkpoint
        written), TrainingInterrupted on Ctrl-C (after checkpointing the last completed step).
        """
        self.stopping.new_run()
        interrupts, c = self.stopping.interrupts, self.config
        self._say_settings()
        with blas_threads(c.threads), interrupts.installed():
            with interrupts.cut_short_allowed():
                self.setup()
            first_step = self.step
            bar = ProgressBar(self.progress, c.max_steps, self.step, self.echo)
            try:
                last_val = self._loop(bar)
                if self._saved_step != self.step:
                    self.save()  # a run that max_epochs ended between two saves
                self.stopping.stop_if_asked()
            except KeyboardInterrupt:
                bar.close()
                raise self._save_on_interrupt() from None
            finally:
                bar.close()
            self._say_time(self.step - first_step)
            if c.average_last is not None:
                with interrupts.cut_short_allowed():
                    self._average()
        return last_val

    def _say_settings(self):
        """Once, when the run starts: the recipe's values in use, and a keep_last raised to average_last."""
        c = self.config
        if c.recipe is not None:
            self.echo(f"--recipe {c.recipe}: " + ", ".join(f"{flag_of(name)} {getattr(c, name)}"
                                                           for name in RECIPES[c.recipe]) + " (options given win)")
        if self.keep > c.keep_last:
            self.echo(f"--keep-last {c.keep_last} raised to {self.keep}: --average-last {c.average_last} "
                      "averages that many checkpoints")

    def _say_time(self, steps):
        seconds = self.stopping.lead_seconds()  # rank 0 says it
        before = self.stopping.clock.before
        self.echo(f"trained {steps} steps in {(seconds - before) / 60:.1f} min"
                  + (f" ({seconds / 60:.1f} min in all, the parts before --resume included)" if before else ""))

    def _average(self):
        """``average_last``: rank 0 averages the newest checkpoints into averaged.npz, loads and validates
        it (``self.averaged``), while the other ranks wait."""
        if self.lead:
            self.averaged = average_and_load(self.save_dir, self.config.average_last, self.config.device, self.echo)
            self._validate_model(self.averaged.model, {"averaged": self.averaged.count}, self.averaged.label())
        self.comm.barrier(timeout=None)

    def _loop(self, bar):
        c, at, last_val, rate, rules = self.config, self.position, None, TokenRate(), self.stopping
        if c.init_from and at.step == 0 and not self.resume:
            self._validate_now()  # where fine-tuning starts: the --init-from model, logged as step 0
        self.model.train()
        rules.start(at.train_seconds)
        self._save_timer = Every(c.save_every_minutes, at.train_seconds)
        self._eval_timer = Every(c.eval_every_minutes, at.train_seconds)
        while not rules.stop_reason(at):
            batches = self.train_data.batches(c.max_tokens, seed=c.seed, epoch=at.epoch)
            while at.batch_in_epoch < len(batches) and not rules.stop_reason(at):
                rules.stop_if_asked()
                result = self._step_or_stop(batches[at.batch_in_epoch:at.batch_in_epoch + c.accum * self.comm.size])
                rules.step_done(result)
                if not result.applied:
                    (self._overflowed if result.overflowed else self._skipped)(result, bar)
                    continue
                if self.comm.size > 1 and at.step % c.check_every == 0:
                    distributed.check_same_parameters(self.comm, self.model.named_parameters(), at.step)
                rate.add(result.tokens)
                if at.step % c.log_every == 0 or at.step == 1:
                    self._log_training(result, rate.take(), bar)
                bar.advance()
                rules.applied()
                if (at.step % c.eval_every == 0 or at.step == c.max_steps or rules.early_stop
                        or self._eval_timer.due(result.seconds)):
                    last_val = self._validate_now()
                    rules.validated(self.comm.broadcast_object(None if last_val is None else last_val["bleu_greedy"]))
                if (at.step % c.save_every == 0 or at.step == c.max_steps or rules.early_stop
                        or self._save_timer.due(result.seconds)):
                    self.save()
            at.end_epoch_if_done(len(batches))
        if rules.early_stop:
            self.echo(f"step {at.step}: training stopped early: {rules.early_stop}")
        if self.graphs is not None:
            self.echo(f"CUDA graphs: {self.graphs.num_shapes} batch shapes, {self.graphs.num_graphs} graphs captured, "
                      f"{self.graphs.replays} steps replayed, private pool {self.graphs.pool_bytes() / 2 ** 20:.1f} MiB"
                      + (f"; capture given up: {self.graphs.failed}" if self.graphs.failed else ""))
        return last_val

    def _step_or_stop(self, batches):
        """``train_step``, turning the allocator's out-of-memory error into one line."""
        try:
            return self.train_step(batches)
        except backend.out_of_memory_errors() as error:
            asked, free = backend.out_of_memory_report(error)
            self.adam.zero_grad()
            raise TrainingOutOfMemory(
                f"out of GPU memory at step {self.step + 1}: a batch of --max-tokens {self.config.max_tokens} "
                f"asked for {_mib(asked)} with {_mib(free)} free; lower --max-tokens (or raise --accum to keep the "
                f"tokens per step); {self._checkpoint_note()}") from None

    def train_step(self, batches):
        """One optimiser step over ``batches`` (gradient accumulation); returns its ``StepResult``.

        With several ranks ``batches`` are the step's batches of all of them (the same list on
        every rank): rank r takes the r-th of ``nproc`` consecutive parts. The loss of each batch
        is divided by the target tokens of all of them, so the summed gradient is the one a single
        process would compute over all ``batches``.

        The position in the data moves past ``batches`` in any case. The update is skipped
        (parameters, Adam's moments and the step count unchanged) when the loss is not finite
        (``grad_norm`` is then None) or the gradient norm is not finite (in fp16: an overflow of the
        scaled gradients, ``overflowed``; the loss scale backs off).
        """
        if self.graphs is not None:
            return self._replayed_step(batches)
        part = -(-len(batches) // self.comm.size)
        mine = batches[self.comm.rank * part:(self.comm.rank + 1) * part]
        tokens = sum(b.num_tokens for b in batches)  # every rank's parts together: no collective needed
        total_loss = total_nll = 0.0
        backward_scale = self.scaler.scale if self.scaler.enabled else 1.0
        interrupts = self.stopping.interrupts
        self._boundary_rng = tf_random.get_rng_state()
        with interrupts.cut_short_allowed():  # nothing of the run's state changes until the update below
            self.adam.zero_grad()
            for i, batch in enumerate(mine):
                if self.buckets is not None and i == len(mine) - 1:
                    self.buckets.arm()  # the last backward pass all-reduces the buckets as they fill
                with amp.autocast(self.precision), self._overflow_quietly():
                    loss, nll = batch_loss(self.model, batch, self.config.label_smoothing)
                    (loss * (backward_scale / tokens)).backward()
                total_loss += loss.item()
                total_nll += nll.item()
            if self.buckets is not None:
                self.buckets.finish()
        self._boundary_rng = None
        # the step's one collective: the loss totals, whether some rank had a Ctrl-C, and rank 0's clock
        totals = self.comm.all_reduce(numpy.array([total_loss, total_nll, float(interrupts.pending),
                                                   self.stopping.lead_seconds()]))

        def update():
            grad_norm, overflowed = self.scaler.step(self.adam)
            return grad_norm, overflowed, grad_norm is not None and math.isfinite(grad_norm)

        return self._settle(batches, tokens, float(totals[0]), float(totals[1]), update,
                            interrupted=totals[2] > 0, seconds=float(totals[3]))

    def _replayed_step(self, batches):
        """``train_step`` with ``cuda_graphs="on"``: the step's device work is one captured graph
        (``graphs.GraphedStep``); the update is skipped on the device, and the same rules follow
        from its flag. A Ctrl-C waits for the step: its update is part of the graph."""
        tokens = sum(b.num_tokens for b in batches)
        scale = self.scaler.scale if self.scaler.enabled else 1.0
        seconds = self.stopping.lead_seconds()  # one process: the update is in the graph, so before it
        self._set_schedule_time(seconds)
        loss_sum, nll_sum, norm, applied = self.graphs.run(batches, tokens, scale)

        def update():  # already done on the device (a non-finite loss is never applied there either)
            if self.scaler.enabled:
                self.scaler.update(not applied)
            return norm, self.scaler.enabled and not applied, applied

        return self._settle(batches, tokens, loss_sum, nll_sum, update, seconds=seconds)

    def _set_schedule_time(self, seconds):
        """A schedule of the time budget (``schedule="time"``) learns the elapsed fraction of the time limit."""
        if hasattr(self.adam.lr, "elapsed_fraction"):
            self.adam.lr.elapsed_fraction = self.stopping.clock.fraction(seconds)

    def _settle(self, batches, tokens, loss_sum, nll_sum, update, interrupted=False, seconds=0.0):
        """What both steps share once the passes are done: the loss and NLL per target token; the
        update (``update()`` → (gradient norm, overflowed, applied)) only where the loss is finite,
        under fp16's loss-scale floor, at the learning rate of the run's agreed ``seconds``; the
        position moved past ``batches`` and to ``seconds``."""
        loss, nll = loss_sum / tokens, nll_sum / tokens
        self._set_schedule_time(seconds)
        self.position.train_seconds = seconds
        time_up = self.stopping.clock.out_of_time(seconds)
        grad_norm, overflowed, applied = None, False, False
        if math.isfinite(loss):
            with self.stopping.scale_floor_stops(self.step + 1):
                grad_norm, overflowed, applied = update()
        self.position.advance(len(batches), tokens, applied=applied)
        return StepResult(loss, nll, tokens, grad_norm, applied, overflowed, bool(interrupted), bool(time_up), seconds)

    def _overflow_quietly(self):
        """fp16: a scaled gradient that overflows is the scaler's business (the step is skipped and
        logged), not a warning for every op it passes through."""
        return numpy.errstate(over="ignore", invalid="ignore") if self.scaler.enabled else contextlib.nullcontext()

    def log(self, record):
        if self.lead:
            self.metrics.append(record)

    def _log_training(self, result, tokens_per_s, bar):
        record = {"step": self.step, "epoch": self.epoch + 1, "loss": round(result.loss, 5),
                  "nll": round(result.nll, 5), "ppl": round(perplexity(result.nll), 4),
                  "lr": self.adam.current_lr(self.step), "grad_norm": round(result.grad_norm, 5),
                  "tokens_per_s": round(tokens_per_s, 1), "skipped_updates": self.skipped_updates}
        left = self.stopping.minutes_left()
        if left is not None:
            record["minutes_left"] = round(left, 2)
        if self.scaler.enabled:
            record.update(loss_scale=self.scaler.scale, overflow_skipped=self.scaler.skipped_steps)
        if self.graphs is not None:
            record.update(graph_shapes=self.graphs.num_shapes, graphs=self.graphs.num_graphs,
                          graph_pool_mib=round(self.graphs.pool_bytes() / 2 ** 20, 1))
        if self.buckets is not None:
            hidden, seconds = self.buckets.take_timings()
            if hidden is not None:
                record.update(allreduce_ms=round(1000 * seconds, 2), allreduce_hidden=round(hidden, 3))
        self.log(record)
        bar.show(self.skipped_updates, loss=f"{result.loss:.3f}", lr=f"{record['lr']:.2e}", tok_s=f"{tokens_per_s:.0f}",
                 **({} if left is None else {"time_left": f"{left:.1f} min of --time-limit"}))

    def _skipped(self, result, bar):
        """Log and count an update skipped for a non-finite loss or gradient (``max_bad_steps`` in a row
        stop the run)."""
        self.position.skipped_updates += 1
        reason = (f"non-finite loss ({result.loss})" if result.grad_norm is None
                  else f"non-finite gradient norm ({result.grad_norm}) at loss {result.loss:.4g}")
        diverged = self.stopping.skipped(reason, self.step + 1)
        in_a_row = self.stopping.bad_in_a_row
        self.log({"step": self.step + 1, "epoch": self.epoch + 1, "skipped": reason,
                  "skipped_updates": self.skipped_updates, "bad_in_a_row": in_a_row})
        bar.show(self.skipped_updates, last=reason.split(" (")[0])
        bar.note(f"step {self.step + 1}: update skipped, {reason} ({in_a_row} in a row, "
                 f"{self.skipped_updates} in all)")
        if diverged is not None:
            raise diverged

    def _overflowed(self, result, bar):
        """Log an fp16 update skipped because the scaled gradients overflowed (the scale has halved);
        not a bad step: the next one runs at the lower scale."""
        note = f"fp16 gradient overflow, loss scale now {self.scaler.scale:g}"
        self.log({"step": self.step + 1, "epoch": self.epoch + 1, "skipped": note, "loss_scale": self.scaler.scale,
                  "overflow_skipped": self.scaler.skipped_steps})
        bar.note(f"step {self.step + 1}: update skipped, {note} ({self.scaler.skipped_steps} in all)")

    # ------------------------------------------------------------------ validation
    def _validate_now(self):
        """Validation on rank 0, while the other ranks wait (as long as it takes)."""
        self.stopping.stop_if_asked()
        record = None
        if self.lead:
            with self.stopping.interrupts.cut_short_allowed():
                record = self.validate()
        self.comm.barrier(timeout=None)
        self._eval_timer.reset(self.position.train_seconds)
        self.model.train()
        return record

    def validate(self):
        """Validation loss, perplexity, greedy BLEU and exact match (of ``bleu_samples`` sentences), logged;
        in the run's precision."""
        return self._validate_model(self.model)

    def _validate_model(self, model, extra=None, label=None):
        """``validate`` of ``model`` (the run's, or the average: ``extra`` {"averaged": N} joins its record)."""
        with amp.autocast(self.precision):
            loss, nll = validation_loss(model, self.val_data, self.config.max_tokens, self.config.label_smoothing)
            sources, references = (side[:self.config.bleu_samples] for side in self.val_text)
            _, bleu, exact = translation_scores(model, self.tokenizer, sources, references, beam_size=1)
        record = {"step": self.step, "split": "val", "loss": round(loss, 5), "nll": round(nll, 5),
                  "ppl": round(perplexity(nll), 4), "bleu_greedy": round(bleu.score, 2),
                  "exact_match_greedy": round(exact, 4), "bleu_sentences": len(references), **(extra or {})}
        self.log(record)
        left = self.stopping.minutes_left() if label is None else None
        self.echo(f"step {self.step}{f', {label}' if label else ''}: val loss {loss:.3f}, ppl {record['ppl']:.2f}, "
                  f"BLEU {bleu.score:.2f} (greedy, {len(references)} sentences), exact match {exact:.1%}"
                  + ("" if left is None else f"; {left:.1f} min of --time-limit left"))
        return record

    # ------------------------------------------------------------------ checkpoints
    def metadata(self, rng_states=None):
        return run_metadata(self.config, self.model, self.tokenizer, self.position, rng_states, self.scaler)

    def save(self):
        """Checkpoint the current step (a Ctrl-C waits until it and the pruning are done): rank 0
        writes it, with every rank's dropout generator state, while the others wait."""
        path = checkpoint.checkpoint_path(self.save_dir, self.step)
        rng_states = self.comm.all_gather_object(tf_random.get_rng_state())
        if self.lead:
            checkpoint.save_checkpoint(path, self.model.state_dict(), self.metadata(rng_states),
                                       self.adam.state_dict())
            checkpoint.prune_checkpoints(self.save_dir, self.keep)
        self._saved_step = self.step
        self._save_timer.reset(self.position.train_seconds)
        self.comm.barrier(timeout=None)
        return path

    def _newest_checkpoint(self):
        newest = checkpoint.list_checkpoints(self.save_dir)[-1:]
        return newest[0] if newest else None

    def _checkpoint_note(self):
        """What a stop leaves behind: the newest checkpoint, intact, or none."""
        return _kept_note(self._newest_checkpoint())

    def _save_on_interrupt(self):
        """A TrainingInterrupted naming the checkpoint of the last completed step, saved if need be."""
        forced = self.stopping.interrupts.stopping()  # a further Ctrl-C stops at once, saving nothing
        newest = self._newest_checkpoint()
        if forced:
            return self._interrupted(f"interrupted at step {self.step} before a checkpoint could be saved; "
                                     f"{_kept_note(newest)}", newest)
        if self._boundary_rng is not None:  # undo the dropout draws of a step cut short
            tf_random.set_rng_state(self._boundary_rng)
        path = checkpoint.checkpoint_path(self.save_dir, self.step)
        if self._saved_step != self.step:
            try:
                self.save()
            except (OSError, checkpoint.CheckpointError) as error:
                return self._interrupted(f"interrupted at step {self.step}; saving it failed ({error})", newest)
        return self._interrupted(f"interrupted at step {self.step}, which is saved in {path}; continue with --resume",
                                 path)

    def _interrupted(self, message, path):
        self.echo(message)
        return TrainingInterrupted(message, path)


def _silent(*args, **kwargs):
    """The echo of the ranks other than 0."""


def _mib(count):
    return "an unknown amount" if count is None else f"{count / 2 ** 20:,.1f} MiB"


def _kept_note(newest):
    return f"the last checkpoint, {newest}, is intact" if newest else "no checkpoint was written"
