"""What a training run tells as it goes: the records of metrics.jsonl (every ``log_every`` steps,
each skipped update, each validation), the progress bar's figures and notes, and the lines it says
(the settings in use, each validation, the time trained). Rank 0 alone writes and says: the other
ranks' report is handed a silent ``echo`` and no bar, and writes no record."""

from .config import flag_of
from .evaluation import perplexity
from .metrics_log import LOG_FILE, MetricsLog
from .progress import ProgressBar
from .recipes import RECIPES

__all__ = ["RunReport", "skip_reason"]


def skip_reason(result):
    """Why the update of a step (its ``StepResult``) was skipped: a non-finite loss or gradient norm."""
    return (f"non-finite loss ({result.loss})" if result.grad_norm is None
            else f"non-finite gradient norm ({result.grad_norm}) at loss {result.loss:.4g}")


class RunReport:
    """The records and lines of one run of ``config`` (resolved) in ``save_dir``; ``lead``: rank 0,
    the one that writes; ``stopping`` (``StoppingRules``) tells the minutes left of a time limit."""

    def __init__(self, config, save_dir, lead, echo, stopping):
        self.config, self.lead, self.echo, self.stopping = config, lead, echo, stopping
        self.metrics = MetricsLog(save_dir / LOG_FILE)
        self.bar = ProgressBar(False, 0, 0, echo)  # no bar until ``open_bar``: notes go to ``echo``

    def log(self, record):
        if self.lead:
            self.metrics.append(record)

    def open_bar(self, enabled, step):
        """A progress bar over the run's steps from ``step`` (shown where ``enabled``)."""
        self.bar = ProgressBar(enabled, self.config.max_steps, step, self.echo)

    def close_bar(self):
        self.bar.close()

    # ------------------------------------------------------------------ said once
    def settings(self, keep):
        """When the run starts: the recipe's values in use, and a keep_last raised to ``keep``."""
        c = self.config
        if c.recipe is not None:
            self.echo(f"--recipe {c.recipe}: " + ", ".join(f"{flag_of(name)} {getattr(c, name)}"
                                                           for name in RECIPES[c.recipe]) + " (options given win)")
        if keep > c.keep_last:
            self.echo(f"--keep-last {c.keep_last} raised to {keep}: --average-last {c.average_last} "
                      "averages that many checkpoints")

    def time_trained(self, steps):
        """When the run ends: ``steps`` trained in how many minutes (and in all, with a --resume)."""
        seconds = self.stopping.lead_seconds()  # rank 0 says it
        before = self.stopping.clock.before
        self.echo(f"trained {steps} steps in {(seconds - before) / 60:.1f} min"
                  + (f" ({seconds / 60:.1f} min in all, the parts before --resume included)" if before else ""))

    # ------------------------------------------------------------------ each step
    def training(self, step, epoch, result, lr, tokens_per_s, skipped_updates, scaler, graphs=None, buckets=None):
        """The record of an applied update (``result``, a ``StepResult``, at learning rate ``lr``) with
        what fp16's ``scaler``, the CUDA ``graphs`` and the all-reduce's ``buckets`` add; and the bar's figures."""
        record = {"step": step, "epoch": epoch + 1, "loss": round(result.loss, 5),
                  "nll": round(result.nll, 5), "ppl": round(perplexity(result.nll), 4),
                  "lr": lr, "grad_norm": round(result.grad_norm, 5),
                  "tokens_per_s": round(tokens_per_s, 1), "skipped_updates": skipped_updates}
        left = self.stopping.minutes_left()
        if left is not None:
            record["minutes_left"] = round(left, 2)
        if scaler.enabled:
            record.update(loss_scale=scaler.scale, overflow_skipped=scaler.skipped_steps)
        if graphs is not None:
            record.update(graph_shapes=graphs.num_shapes, graphs=graphs.num_graphs,
                          graph_pool_mib=round(graphs.pool_bytes() / 2 ** 20, 1))
        if buckets is not None:
            hidden, seconds = buckets.take_timings()
            if hidden is not None:
                record.update(allreduce_ms=round(1000 * seconds, 2), allreduce_hidden=round(hidden, 3))
        self.log(record)
        self.bar.show(skipped_updates, loss=f"{result.loss:.3f}", lr=f"{lr:.2e}", tok_s=f"{tokens_per_s:.0f}",
                      **({} if left is None else {"time_left": f"{left:.1f} min of --time-limit"}))

    def skipped(self, step, epoch, reason, skipped_updates, in_a_row):
        """An update skipped at ``step`` for a non-finite loss or gradient (``reason``)."""
        self.log({"step": step, "epoch": epoch + 1, "skipped": reason,
                  "skipped_updates": skipped_updates, "bad_in_a_row": in_a_row})
        self.bar.show(skipped_updates, last=reason.split(" (")[0])
        self.bar.note(f"step {step}: update skipped, {reason} ({in_a_row} in a row, {skipped_updates} in all)")

    def overflowed(self, step, epoch, scaler):
        """An fp16 update skipped at ``step`` because the scaled gradients overflowed (the scale has halved)."""
        note = f"fp16 gradient overflow, loss scale now {scaler.scale:g}"
        self.log({"step": step, "epoch": epoch + 1, "skipped": note, "loss_scale": scaler.scale,
                  "overflow_skipped": scaler.skipped_steps})
        self.bar.note(f"step {step}: update skipped, {note} ({scaler.skipped_steps} in all)")

    # ------------------------------------------------------------------ each validation
    def validation(self, step, scores, extra=None, label=None):
        """The record and line of a validation at ``step`` (``scores``: ``evaluation.ValidationScores``)
        of the run's model, or of another one (``label``: which; ``extra`` joins its record); returns the record."""
        record = {"step": step, "split": "val", "loss": round(scores.loss, 5), "nll": round(scores.nll, 5),
                  "ppl": round(perplexity(scores.nll), 4), "bleu_greedy": round(scores.bleu.score, 2),
                  "exact_match_greedy": round(scores.exact, 4), "bleu_sentences": scores.sentences,
                  **(extra or {})}
        self.log(record)
        left = self.stopping.minutes_left() if label is None else None
        self.echo(f"step {step}{f', {label}' if label else ''}: val loss {scores.loss:.3f}, ppl {record['ppl']:.2f}, "
                  f"BLEU {scores.bleu.score:.2f} (greedy, {scores.sentences} sentences), exact match {scores.exact:.1%}"
                  + ("" if left is None else f"; {left:.1f} min of --time-limit left"))
        return record
