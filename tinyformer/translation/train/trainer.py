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

import numpy
from pathlib import Path

from ...engine import amp, backend
from .. import distributed
from ...engine import random as tf_random
from .averaging import average_and_load
from .builders import build_parts
from .clock import Every
from .config import ConfigError
from . import graphs
from .evaluation import batch_loss, validation_scores
from .interrupts import save_on_interrupt
from .metrics_log import TokenRate
from .reports import RunReport, skip_reason
from .run_checkpoints import RunCheckpoints
from .state import Position, run_metadata
from .step_result import StepResult
from .stopping import StoppingRules

__all__ = ["Trainer", "blas_threads"]


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
    It loops and delegates: when it stops, and why, is ``stopping`` (``StoppingRules``); what it
    logs and says, ``report`` (``RunReport``); its checkpoints, ``checkpoints`` (``RunCheckpoints``);
    each step returns a ``StepResult``."""

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
        self.precision = amp.get_precision(c.precision)
        self.keep = max(c.keep_last, c.average_last or 0)  # checkpoints kept: at least those averaged
        self.checkpoints = RunCheckpoints(self.save_dir, self.keep, self.comm, self.lead)
        self.stopping = StoppingRules(c, self.comm.size, self.lead, self.checkpoints.note)
        self.report = RunReport(c, self.save_dir, self.lead, self.echo, self.stopping)
        # the parts, from setup() (or handed over)
        self.tokenizer = self.model = self.adam = None
        self.train_data = self.val_data = self.val_text = None
        self.position = Position()
        self.scaler = None            # fp16's loss scale (disabled otherwise)
        self.buckets = None           # the gradient all-reduce, with several ranks
        self._boundary_rng = None     # the dropout generator's state before the forward pass in progress
        self.graphs = None            # the captured steps (graphs.GraphedStep) with cuda_graphs "on"
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
        self.checkpoints.saved_step = self.position.step if self.resume else None
        if self.comm.size > 1:
            self.buckets = distributed.GradientBuckets(self.comm, self.model.parameters(), self.config.bucket_mb)
        if self.config.cuda_graphs == "on":
            self.graphs = graphs.graphed_step(self.config, self.comm.size, self.model, self.adam, self.precision,
                                              self._overflow_quietly, stacklevel=2)

    # ------------------------------------------------------------------ the loop
    def run(self):
        """Train until ``max_steps`` (or ``max_epochs``), then save; returns the last validation record.

        Raises TrainingDiverged after ``max_bad_steps`` skipped updates in a row (no checkpoint
        written), TrainingInterrupted on Ctrl-C (after checkpointing the last completed step).
        """
        self.stopping.new_run()
        interrupts, c = self.stopping.interrupts, self.config
        self.report.settings(self.keep)
        with blas_threads(c.threads), interrupts.installed():
            with interrupts.cut_short_allowed():
                self.setup()
            first_step = self.step
            self.report.open_bar(self.progress, self.step)
            try:
                last_val = self._loop()
                if self.checkpoints.saved_step != self.step:
                    self.save()  # a run that max_epochs ended between two saves
                self.stopping.stop_if_asked()
            except KeyboardInterrupt:
                self.report.close_bar()
                raise self._interrupted() from None
            finally:
                self.report.close_bar()
            self.report.time_trained(self.step - first_step)
            if c.average_last is not None:
                with interrupts.cut_short_allowed():
                    self._average()
        return last_val

    def _loop(self):
        """The epochs and their steps until a stopping rule says stop; returns the last validation record."""
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
                    self._skipped(result)
                    continue
                if self.comm.size > 1 and at.step % c.check_every == 0:
                    distributed.check_same_parameters(self.comm, self.model.named_parameters(), at.step)
                rate.add(result.tokens)
                if at.step % c.log_every == 0 or at.step == 1:
                    self.report.training(at.step, at.epoch, result, self.adam.current_lr(at.step), rate.take(),
                                         at.skipped_updates, self.scaler, self.graphs, self.buckets)
                self.report.bar.advance()
                rules.applied()
                if self._due(c.eval_every, self._eval_timer, result):
                    last_val = self._validate_now()
                    rules.validated(self.comm.broadcast_object(None if last_val is None else last_val["bleu_greedy"]))
                if self._due(c.save_every, self._save_timer, result):
                    self.save()
            at.end_epoch_if_done(len(batches))
        if rules.early_stop:
            self.echo(f"step {at.step}: training stopped early: {rules.early_stop}")
        if self.graphs is not None:
            self.echo(self.graphs.summary())
        return last_val

    def _due(self, every, timer, result):
        """A validation or checkpoint is due after this update: every ``every`` steps, at ``max_steps``,
        at an early stop, or when its minutes (``timer``) have passed."""
        step = self.step
        return (step % every == 0 or step == self.config.max_steps or self.stopping.early_stop
                or timer.due(result.seconds))

    def _step_or_stop(self, batches):
        """``train_step``, turning the allocator's out-of-memory error into one line."""
        try:
            return self.train_step(batches)
        except backend.out_of_memory_errors() as error:
            asked, free = backend.out_of_memory_report(error)
            self.adam.zero_grad()
            raise self.stopping.out_of_memory(self.step + 1, asked, free) from None

    def _skipped(self, result):
        """Log an update skipped for fp16's overflow (the scale has halved; not a bad step), or count one
        skipped for a non-finite loss or gradient (``max_bad_steps`` in a row stop the run)."""
        if result.overflowed:
            self.report.overflowed(self.step + 1, self.epoch, self.scaler)
            return
        self.position.skipped_updates += 1
        reason = skip_reason(result)
        diverged = self.stopping.skipped(reason, self.step + 1)
        self.report.skipped(self.step + 1, self.epoch, reason, self.skipped_updates, self.stopping.bad_in_a_row)
        if diverged is not None:
            raise diverged

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
        """Append ``record`` to metrics.jsonl (rank 0)."""
        self.report.log(record)

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
        c = self.config
        with amp.autocast(self.precision):
            scores = validation_scores(model, self.tokenizer, self.val_data, self.val_text, c.max_tokens,
                                       c.label_smoothing, c.bleu_samples)
        return self.report.validation(self.step, scores, extra, label)

    def _average(self):
        """``average_last``: rank 0 averages the newest checkpoints into averaged.npz, loads and validates
        it (``self.averaged``), while the other ranks wait."""
        if self.lead:
            self.averaged = average_and_load(self.save_dir, self.config.average_last, self.config.device, self.echo)
            self._validate_model(self.averaged.model, {"averaged": self.averaged.count}, self.averaged.label())
        self.comm.barrier(timeout=None)

    # ------------------------------------------------------------------ checkpoints
    def metadata(self, rng_states=None):
        return run_metadata(self.config, self.model, self.tokenizer, self.position, rng_states, self.scaler)

    def save(self):
        """Checkpoint the current step (a Ctrl-C waits until it and the pruning are done): rank 0
        writes it, with every rank's dropout generator state, while the others wait."""
        path = self.checkpoints.write(self.step, self.model, self.adam, self.metadata)
        self._save_timer.reset(self.position.train_seconds)
        return path

    def _interrupted(self):
        """The TrainingInterrupted of a Ctrl-C (the last completed step saved if need be), said."""
        error = save_on_interrupt(self.stopping.interrupts, self.step, self.checkpoints, self.save, self._boundary_rng)
        self.echo(str(error))
        return error


def _silent(*args, **kwargs):
    """The echo of the ranks other than 0."""
