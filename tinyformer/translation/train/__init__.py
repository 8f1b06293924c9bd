"""Training a translation model the paper's way (§5): token-count batches, label smoothing,
Adam with warm-up, periodic validation, atomic checkpoints, exact resume.

``Trainer(TrainConfig(...)).run()`` is what ``tinyformer train`` calls. ``config`` declares the
options (and everything derived from them), ``builders`` makes the parts a run needs from a
config (``init_from``: from another run's model and tokenizer, for fine-tuning), ``trainer`` runs
them; ``stopping`` (when a run stops, and why), ``interrupts`` (Ctrl-C), ``reports`` (what a run
logs and says), ``metrics_log`` (metrics.jsonl), ``run_checkpoints`` (a run's checkpoints),
``state`` (what a checkpoint holds), ``migration`` (older checkpoints read as today's) and
``evaluation`` (loss and BLEU) are its pieces.

Everything a run needs to continue exactly — parameters, Adam's moments and step, the dropout
generator's state, the position in the epoch — is in each checkpoint, so ``--resume`` on the
CPU repeats the uninterrupted run's losses; a process killed at any point (SIGKILL) leaves
checkpoints that load and resume exactly.
"""

from . import builders
from .builders import Parts, build_parts, load_corpus
from .config import DATASETS, ConfigError, TrainConfig
from .evaluation import evaluate
from .metrics_log import LOG_FILE
from .state import TOKENIZER_FILE, load_model
from .interrupts import TrainingInterrupted
from .stopping import TrainingDiverged, TrainingOutOfMemory
from .trainer import Trainer, blas_threads

__all__ = ["TrainConfig", "ConfigError", "Trainer", "TrainingDiverged", "TrainingInterrupted", "TrainingOutOfMemory",
           "DATASETS",
           "Parts", "build_parts", "load_corpus", "load_model", "evaluate", "blas_threads", "LOG_FILE",
           "TOKENIZER_FILE"]
