"""tinyformer's training step as the step benchmark times it: eager (``TinyformerRunner``, the
trainer's own loss), and captured as a CUDA graph (``TinyformerGraphedRunner``, as ``tinyformer
train --cuda-graphs on`` runs it). Each runner's ``step()`` runs one whole step and returns its loss."""

import tinyformer  # noqa: F401  first: its OpenBLAS setting (common/blas_spin.py) must precede NumPy
import numpy

from step_batch import LABEL_SMOOTHING, PAD
from step_device import in_eval_mode, loss_value, synchronize


class TinyformerRunner:
    def __init__(self, preset, vocab, batch, device, seed, precision="fp32"):
        import tinyformer as tf
        from tinyformer.engine import amp, backend, functional as F
        from tinyformer.model import optim
        from tinyformer.model.nn import Transformer
        from tinyformer.translation.data.batching import Batch
        from tinyformer.translation.train.evaluation import batch_loss

        self.F, self.tf, self.amp, self.precision, self.batch_loss = F, tf, amp, precision, batch_loss
        tf.manual_seed(seed)
        self.model = Transformer.from_preset(preset, vocab_size=vocab, pad_id=PAD, seed=seed)
        self.config = self.model.config.to_dict()
        if device == "cuda":
            self.model.to("cuda")
        else:  # as Trainer does on the CPU: each step's large arrays reuse the last step's memory
            backend.keep_freed_memory()
        self.model.train()
        self.optimizer = optim.Adam(self.model.parameters(), lr=optim.NoamSchedule(self.config["d_model"], 4000),
                                    betas=(0.9, 0.98), eps=1e-9)
        move = (lambda a: backend.to_device(a, "cuda")) if device == "cuda" else (lambda a: a)
        self.src, self.tgt_in, self.tgt_out = (move(batch[k]) for k in ("src", "tgt_in", "tgt_out"))
        # The trainer's batch (host arrays, as Trainer.train_step hands them to batch_loss)
        self.batch = Batch(batch["src"], batch["tgt_in"], batch["tgt_out"], numpy.arange(len(batch["src"])),
                           pad_id=PAD)
        self.device = device
        self.smoothing = LABEL_SMOOTHING
        self.scaler = optim.GradScaler(enabled=amp.get_precision(precision).loss_scaling)

    def num_parameters(self):
        return self.model.num_parameters()

    def step(self):
        """One training step as ``Trainer.train_step`` computes its loss (``batch_loss``: on the CPU the
        logits of the counted target positions only), divided by the batch's target tokens."""
        self.optimizer.zero_grad()
        with self.amp.autocast(self.precision):
            loss_sum, _ = self.batch_loss(self.model, self.batch, self.smoothing)
            loss = loss_sum / self.batch.num_tokens
            self.scaler.scale_loss(loss).backward()
        self.scaler.step(self.optimizer)
        return loss_value(loss, self.device)

    def eval_loss(self, rows):
        with in_eval_mode(self.model), self.tf.no_grad(), self.amp.autocast(self.precision):
            logits = self.model(self.src[:rows], self.tgt_in[:rows])
            loss = self.F.cross_entropy(logits, self.tgt_out[:rows], label_smoothing=self.smoothing, ignore_index=PAD)
        return loss.item()


class TinyformerGraphedRunner(TinyformerRunner):
    """tinyformer's step as ``tinyformer train --cuda-graphs on`` runs it: a ``train.graphs.GraphedStep``
    over the bench's batch as a ``data.Batch`` (its shape is its own bucket: the rows fill the
    token budget and 32 is a multiple of 8). Its first step runs eagerly, the second captures the
    graph, later ones copy the batch into the static inputs and replay. ``capture``: a
    ``backend.GraphCapture`` (made here on the GPU) or, in tests, ``EmulatedCapture``
    (the tests' emulated capture)."""

    def __init__(self, preset, vocab, batch, device, seed, precision="fp32", capture=None):
        super().__init__(preset, vocab, batch, device, seed, precision)
        from tinyformer.engine import backend
        from tinyformer.translation.train.graphs import GraphedStep

        rows, src_len, tgt_len = self.batch.shape
        # A capture that is given up is reported from GraphedStep.failed (unavailable()), not as a warning.
        self.graphed = GraphedStep(self.model, self.optimizer, self.amp.get_precision(precision), self.smoothing,
                                   rows * max(src_len, tgt_len), self.config["max_len"],
                                   backend.GraphCapture() if capture is None else capture,
                                   warn=lambda message, category=None: None)

    def step(self):
        scale = self.scaler.scale if self.scaler.enabled else 1.0
        loss_sum, _, _, applied = self.graphed.run([self.batch], self.batch.num_tokens, scale)
        if self.scaler.enabled:
            self.scaler.update(not applied)
        synchronize(self.device)
        return loss_sum / self.batch.num_tokens

    def launches(self):
        """Kernel launches per replayed step (one captured shape here), or None where unknown."""
        counts = [n for n in self.graphed.kernel_launches().values() if n is not None]
        return counts[0] if len(counts) == 1 else None

    def unavailable(self):
        """Why the timed steps were not graph replays (capture given up, or none captured), or None."""
        if self.graphed.failed:
            return f"capture given up ({self.graphed.failed}); the steps ran eagerly"
        if self.graphed.num_graphs == 0:
            return "no graph was captured"
        return None
