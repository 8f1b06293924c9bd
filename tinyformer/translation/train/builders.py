"""The parts of a training run, built from a resolved TrainConfig (as Joey NMT's builders do): the
run directory, the corpus, the tokenizer, the batched data, the model, Adam on the Noam schedule
and, on resume, all of them as the newest checkpoint left them. ``Trainer`` runs what
``build_parts`` returns; it assembles nothing itself. A run ``--init-from`` another takes that run's
model, weights and tokenizer instead of a preset's and a new BPE (``init_from``).

``build_parts`` runs one step per concern: ``open_run`` (the run directory, the ``--init-from``
checkpoint), ``run_config`` (a new config holding what was found: the given one is not changed),
``build_run_data`` (tokenizer and batches, from the corpus of ``--train`` or the built-in data),
the model and optimiser (``build_model``, ``build_optimizer``, ``build_scaler``), and on resume
``restore_run``.

The special ids (padding, the decoder's start, EOS) are the tokenizer's: tinyformer's joint BPE has
0, 2 and 3, an imported Marian tokenizer its own.

With several ranks, rank 0 alone touches the run directory: it checks it, trains (or loads) the
tokenizer and shares it, restores the checkpoint on resume and broadcasts parameters, Adam's
state, the position and each rank's dropout generator state; every rank builds the same data
(and so the same batch order) from the seed.
"""

import dataclasses
import tempfile
from pathlib import Path

import numpy

from .. import checkpoint, distributed
from ...engine import random as tf_random
from ..data.batching import ParallelData
from ...model.nn import Transformer, limits
from ...model.nn.presets import preset_config
from ...engine.amp import get_precision
from ...engine.kernels import paths
from ...model.optim import Adam, GradScaler, NoamSchedule, TimeBudgetSchedule
from . import init_from
from .config import check_languages, flag_of
from .metrics_log import LOG_FILE, MetricsLog
from .state import Position, restore_checkpoint, run_tokenizer_path

__all__ = ["Parts", "BUILT_FIELDS", "build_parts", "open_run", "run_config", "build_run_data", "restore_run",
           "prepare_save_dir", "load_corpus", "corpus_files", "build_tokenizer", "build_data", "build_model",
           "build_optimizer", "build_scaler"]


# The fields of a run's config that building fills in: the name of the --init-from run's tokenizer,
# and the SHA-256 of the corpus files of --train when the run starts.
BUILT_FIELDS = ("tokenizer_file", "data_files")


@dataclasses.dataclass
class Parts:
    """Everything a Trainer runs."""

    tokenizer: object          # the run's joint BPE (data.Tokenizer), or the --init-from run's (also Marian)
    train_data: ParallelData
    val_data: ParallelData
    val_text: tuple            # (sources, references) of the validation split, for greedy BLEU
    model: Transformer
    adam: Adam                 # with the run's schedule (NoamSchedule or TimeBudgetSchedule) as its lr
    position: Position         # step 0, or where the resumed checkpoint stood
    scaler: GradScaler  # fp16's dynamic loss scale (disabled in fp32 and bf16), resumed
    config: object             # the run's TrainConfig as built: the one given, with BUILT_FIELDS filled in

    def found_in(self, config):
        """``config`` with what building found (``BUILT_FIELDS``) taken from the parts' config."""
        return dataclasses.replace(config, **{name: getattr(self.config, name) for name in BUILT_FIELDS})


def build_parts(config, resume=False, echo=print, comm=None):
    """The parts of the run ``config`` (resolved) describes; with ``resume``, restored from the
    newest checkpoint in its save_dir, and its metrics log cut back to that step. ``comm`` (a
    ``distributed.Communicator``; default the group of one): the ranks that train together, which
    must have been started alike (``StartupMismatch`` names what differs). ``config`` is not
    changed: the parts' ``config`` is the run's, with what building found (``BUILT_FIELDS``)."""
    comm = comm if comm is not None else distributed.SingleProcess()
    if comm.size > 1:
        distributed.check_agreement(comm, _run_facts(config, resume))
    start, newest = open_run(config, resume, comm, echo)
    corpus = corpus_files(config) if config.data == "files" else None
    config = run_config(config, start, corpus)
    tokenizer, train_data, val_data, val_text = build_run_data(config, start, corpus, resume, comm, echo)
    if start is None:
        model = build_model(config, tokenizer, comm.rank)
    else:
        model = init_from.build_model(config, start, comm.rank)
    adam, scaler = build_optimizer(config, model), build_scaler(config)
    position, rng_states = Position(), None
    if resume and comm.rank == 0:
        position, rng_states = restore_run(newest, model, adam, scaler, tokenizer, start, comm.size, echo)
    if comm.size > 1:
        position = _synchronise(comm, model, adam, position, rng_states)
        scaler.load_state_dict(comm.broadcast_object(scaler.state_dict()))
    _report(config, start, resume, model, train_data, comm, echo)
    return Parts(tokenizer, train_data, val_data, val_text, model, adam, position, scaler, config)


def open_run(config, resume, comm, echo=print):
    """(the Start of a run ``--init-from`` another, or None; the newest checkpoint to resume from, on
    rank 0). Rank 0 reads the ``--init-from`` checkpoint (before any write) and prepares save_dir;
    every rank receives the Start."""
    lead = comm.rank == 0
    start = init_from.read_start(config) if lead and config.init_from and not resume else None
    newest = prepare_save_dir(Path(config.save_dir), resume, echo) if lead else None
    if config.init_from:
        start = init_from.share(comm, init_from.resumed_start(newest) if lead and resume else start)
    return start, newest


def run_config(config, start, corpus=None):
    """A copy of ``config`` with ``BUILT_FIELDS`` filled in: the ``--init-from`` run's tokenizer name
    (``start``), and on a run's first start the SHA-256 of its corpus files (``corpus``, from
    ``corpus_files``)."""
    changes = {}
    if start is not None:
        changes["tokenizer_file"] = start.tokenizer_file
    if corpus is not None and config.data_files is None:
        changes["data_files"] = {files.option: fingerprints for files, fingerprints in corpus.values()}
    return dataclasses.replace(config, **changes)


def build_run_data(config, start, corpus, resume, comm, echo=print):
    """(tokenizer, training data, validation data, validation text) of the run: the ``--init-from``
    run's tokenizer (``start``) or the run's own, and the corpus (``corpus``: ``--train``'s files) or
    the built-in data, cut to the pairs the model can hold."""
    handed, max_len = None, config.max_len
    if start is not None:
        handed = _shared_tokenizer(comm, lambda: init_from.adopt_tokenizer(config, start, resume, echo))
        max_len = init_from.data_max_len(config, start, echo)
    if corpus is not None:
        data = build_corpus_data(config, corpus, comm, echo, handed, max_len)
    else:
        data = _built_in_data(config, comm, echo, handed, max_len)
    train_data = data[1]
    if train_data.num_dropped:
        reasons = {"too long": f"longer than {max_len} tokens",
                   "length ratio": f"with a length ratio over {config.max_ratio:g}" if config.max_ratio else ""}
        echo("dropped " + ", ".join(f"{n:,} training pairs {reasons[why]}"
                                    for why, n in train_data.dropped.items() if n))
    return data


def _built_in_data(config, comm, echo, handed, max_len):
    """(tokenizer, training data, validation data, validation text) of the synthetic task or Multi30k.
    Only rank 0 may download Multi30k; the others read it once rank 0 has it."""
    early = comm.rank == 0 or config.data == "synthetic"
    train_text, val_text = (load_corpus(config, "train"), load_corpus(config, "val")) if early else (None, None)
    tokenizer = handed if handed is not None else \
        _shared_tokenizer(comm, lambda: build_tokenizer(config, train_text, echo))
    if not early:
        train_text, val_text = load_corpus(config, "train"), load_corpus(config, "val")
    train_data = build_data(config, tokenizer, train_text, config.max_ratio, max_len)
    val_data = build_data(config, tokenizer, val_text, max_len=max_len)
    return tokenizer, train_data, val_data, val_text


def restore_run(newest, model, adam, scaler, tokenizer, start, ranks, echo=print):
    """Rank 0 of a resumed run: ``model``, ``adam`` and the loss ``scaler`` as checkpoint ``newest`` left
    them, the metrics log cut back to its step; returns (its Position, each rank's dropout generator
    state). Refuses a checkpoint of another number of ``ranks``. The metrics log is the one beside ``newest``."""
    position, meta = restore_checkpoint(newest, model, adam, tokenizer, start.loaded if start else None)
    if scaler.enabled and "grad_scaler" in meta:
        scaler.load_state_dict(meta["grad_scaler"])
    rng_states = meta.get("rng_states", [meta["rng_state"]])
    if len(rng_states) != ranks:
        raise checkpoint.CheckpointError(f"{newest} holds the dropout state of {len(rng_states)} rank(s), but "
                                         f"{ranks} were started: resume with the run's --nproc")
    dropped = MetricsLog(Path(newest).parent / LOG_FILE).truncate_after(position.step)
    if dropped:
        echo(f"{LOG_FILE}: dropped {dropped} record(s) logged after step {position.step} by the interrupted run")
    echo(f"resumed from {newest.name} at step {position.step} (epoch {position.epoch + 1}, "
         f"batch {position.batch_in_epoch})")
    return position, rng_states


def _report(config, start, resume, model, train_data, comm, echo):
    """The lines a run starts with: where its model comes from, its size and data, the training path."""
    paper = " (the paper's)" if config.paper else ""
    origin = f"{config.preset}{paper}" if start is None else f"--init-from {config.init_from}"
    if start is not None and not resume:
        echo(f"--init-from: the model and weights of {start.source}; a fresh Adam and schedule from step 0")
    echo(f"model: {origin} ({model.extra_repr()}), {model.num_parameters():,} parameters; "
         f"{len(train_data):,} training pairs, {train_data.num_target_tokens:,} target tokens per epoch"
         + (f"; {comm.size} ranks over {comm.name}" if comm.size > 1 else ""))
    echo(paths.training_line(config.device, config.precision, model.d_model // model.config.heads))


def _run_facts(config, resume):
    """What every rank must agree on: the config (but where each host keeps the data), the code,
    and the tokenizer it finds in the run directory, if any."""
    facts = {flag_of(name) or name: value for name, value in config.to_dict().items() if name != "data_dir"}
    facts["--resume"] = resume
    facts["tinyformer code"] = distributed.code_fingerprint()
    facts["numpy"] = numpy.__version__
    path = run_tokenizer_path(config)
    from ..data.tokenizer import tokenizer_sha256

    facts[f"{path} (sha256)"] = tokenizer_sha256(path)
    return facts


def _shared_tokenizer(comm, build):
    """Rank 0's tokenizer (``build()``, trained or loaded there) on every rank: its file, or each file
    of its folder (a Marian tokenizer), travels as bytes, and the other ranks load a temporary copy
    under the same name."""
    if comm.size == 1:
        return build()
    from ..data.tokenizer import load_tokenizer

    tokenizer = build() if comm.rank == 0 else None
    listing = None
    if comm.rank == 0:
        path = Path(tokenizer.path)
        listing = {"name": path.name, "files": sorted(p.name for p in path.iterdir() if p.is_file())
                   if path.is_dir() else None}
    listing = comm.broadcast_object(listing)
    with tempfile.TemporaryDirectory(prefix="tinyformer-tokenizer-") as folder:
        copy = Path(folder) / listing["name"]
        if listing["files"] is None:
            data = comm.broadcast_bytes(path.read_bytes() if comm.rank == 0 else b"")
            if comm.rank != 0:
                copy.write_bytes(data)
        else:
            copy.mkdir()
            for name in listing["files"]:
                data = comm.broadcast_bytes((path / name).read_bytes() if comm.rank == 0 else b"")
                if comm.rank != 0:
                    (copy / name).write_bytes(data)
        return tokenizer if comm.rank == 0 else load_tokenizer(copy)


def _synchronise(comm, model, adam, position, rng_states):
    """Every rank at rank 0's state: parameters, Adam's moments and step, the position; on resume
    each rank's dropout generator from the checkpoint (else it stays on its own stream, build_model's)."""
    distributed.broadcast_parameters(comm, model.parameters())
    distributed.broadcast_optimizer(comm, adam)
    shared = comm.broadcast_object({"position": dataclasses.asdict(position), "rng_states": rng_states})
    if shared["rng_states"] is not None:
        tf_random.set_rng_state(shared["rng_states"][comm.rank])
    return Position(**shared["position"])


def prepare_save_dir(save_dir, resume, echo=print):
    """Create the run directory; returns its newest checkpoint (None for a new run).

    A new run refuses a directory holding checkpoints (FileExistsError); a resumed one needs one
    (FileNotFoundError) and removes the temporaries of a save that was killed before its rename.
    """
    existing = checkpoint.list_checkpoints(save_dir)
    if existing and not resume:
        raise FileExistsError(f"{save_dir} already holds checkpoints (newest {existing[-1].name}): pass --resume "
                              "to continue that run, or choose another --save-dir")
    if resume and not existing:
        raise FileNotFoundError(f"--resume: no checkpoint_*.npz in {save_dir}")
    if resume:
        partial = checkpoint.remove_partial_files(save_dir)
        if partial:
            echo(f"removed {len(partial)} partial checkpoint file(s) left by an interrupted save")
    Path(save_dir).mkdir(parents=True, exist_ok=True)
    return existing[-1] if existing else None


def load_corpus(config, split):
    """(source lines, target lines) of ``split`` ("train", "val" or "test") for the configured data."""
    check_languages(config.data, config.src_lang, config.tgt_lang)
    if config.data == "files":
        return _corpus_text(config, split)
    if config.data == "synthetic":
        from ..data.synthetic import synthetic_pairs

        english, german = synthetic_pairs(split, seed=0)
        return (english, german) if config.src_lang == "en" else (german, english)
    from ..data.multi30k import load_multi30k

    name = {"train": "train", "val": "val", "test": "test_2016_flickr"}[split]
    return load_multi30k(name, config.src_lang, config.tgt_lang, data_dir=config.data_dir)


def build_tokenizer(config, train_text, echo=print):
    """The run's joint BPE: the ``spm.model`` in save_dir if there is one (a resumed run, or one handed
    a tokenizer), else one trained on both sides of ``train_text`` and saved there."""
    from ..data.tokenizer import Tokenizer

    path = run_tokenizer_path(config)
    if path.exists():
        return Tokenizer.load(path)
    echo(f"training a joint BPE tokenizer ({config.vocab_size} pieces) on {len(train_text[0]):,} sentence pairs")
    return Tokenizer.train(train_text[0] + train_text[1], path.parent, vocab_size=config.vocab_size, name=path.stem)


def build_data(config, tokenizer, text, max_ratio=None, max_len=None):
    """``text`` (sources, targets) encoded (the targets with ``encode_target_batch``: a Marian tokenizer's
    own model), batched with the tokenizer's special ids; pairs longer than ``max_len`` tokens
    (``config.max_len`` by default), or beyond ``max_ratio``, dropped."""
    src, tgt = text
    return ParallelData(tokenizer.encode_batch(src), tokenizer.encode_target_batch(tgt),
                        max_len=config.max_len if max_len is None else max_len, max_ratio=max_ratio,
                        **special_ids(tokenizer))


def special_ids(tokenizer):
    """The ids a batch pads with, starts the target with and ends each side with: the tokenizer's."""
    return {"pad_id": tokenizer.pad_id, "bos_id": tokenizer.bos_id, "eos_id": tokenizer.eos_id}


CORPUS_OPTIONS = {"train": ("train_data", "--train"), "val": ("valid_data", "--valid"), "test": ("test_data", "--test")}


def _corpus_files(config, split):
    """(CorpusFiles, their SHA-256 by path) of a split of a run on its own corpus, checked against
    the SHA-256 the run recorded when it started (``data_files``): a file changed since is refused,
    naming it. Each file is read through once for its SHA-256, here."""
    from ..data.corpus import CorpusError, file_fingerprints, find_corpus

    field, option = CORPUS_OPTIONS[split]
    files = find_corpus(getattr(config, field), config.src_lang, config.tgt_lang, option)
    fingerprints = file_fingerprints(files)
    recorded = (config.data_files or {}).get(option) or {}
    for path, digest in fingerprints.items():
        if recorded.get(path) not in (None, digest):
            raise CorpusError(f"{option}: {path} has changed since the run was trained on it (SHA-256 "
                              f"{recorded[path][:12]}... then, {digest[:12]}... now)")
    return files, fingerprints


def _corpus_text(config, split):
    from ..data.corpus import CorpusError
    from ..data.prepared import heldout_text, prepare_corpus, read_text

    field, option = CORPUS_OPTIONS[split]
    if getattr(config, field) is not None and split != "train":
        return read_text(_corpus_files(config, split)[0])
    if split == "test":
        raise CorpusError(f"the run on {config.train_data} was given no --test corpus: score files of your own "
                          "with tinyformer eval --hypotheses H --references R")
    if split == "train":
        return read_text(_corpus_files(config, "train")[0])
    from ..data.tokenizer import load_tokenizer

    files, fingerprints = _corpus_files(config, "train")
    prepared = prepare_corpus(files, fingerprints, _cache_dir(config), config.vocab_size, config.tokenizer_sample,
                              config.seed, config.dedup, load_tokenizer(run_tokenizer_path(config)),
                              echo=lambda *a: None)
    return heldout_text(prepared, config.valid_size, config.seed)[1]


def _cache_dir(config):
    from ..data.prepared import default_cache_dir

    return Path(config.corpus_cache) if config.corpus_cache else default_cache_dir(config.save_dir)


def corpus_files(config):
    """{split: (CorpusFiles, their SHA-256 by path)} of each split a run on its own corpus names
    (``--train``, ``--valid``, ``--test``), each checked against what the run recorded (``_corpus_files``)."""
    return {split: _corpus_files(config, split) for split, (field, _) in CORPUS_OPTIONS.items()
            if getattr(config, field)}


def build_corpus_data(config, found, comm, echo=print, tokenizer=None, max_len=None):
    """(tokenizer, training data, validation data, validation text) of a run on its own corpus
    (``--train``; ``found``: its ``corpus_files``): the prepared corpus from the cache (made there by
    the first process that asks, ``data.prepared``), its tokenizer copied into the run, and the
    validation pairs from ``--valid`` or held out of the training pairs. ``tokenizer``: the run's,
    handed over (``--init-from``'s: no BPE is trained); ``max_len``: the longest pair kept
    (``config.max_len`` by default)."""
    from ..data.prepared import heldout_text, prepare_corpus, read_text
    from ...common.atomic import write_atomically
    from ..data.tokenizer import Tokenizer, load_tokenizer

    files = {split: corpus for split, (corpus, _) in found.items()}
    own = run_tokenizer_path(config)
    handed = tokenizer if tokenizer is not None else load_tokenizer(own) if own.exists() else None
    max_len = config.max_len if max_len is None else max_len
    prepared = prepare_corpus(*found["train"], _cache_dir(config), config.vocab_size, config.tokenizer_sample,
                              config.seed, config.dedup, handed, echo if comm.rank == 0 else (lambda *a: None))
    tokenizer = prepared.tokenizer
    if handed is None and comm.rank == 0:
        own.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(own, Path(tokenizer.path).read_bytes())
        tokenizer = Tokenizer.load(own)
    rows = None
    if "val" in files:
        val_text = read_text(files["val"])
        val_data = build_data(config, tokenizer, val_text, max_len=max_len)
    else:
        positions, val_text = heldout_text(prepared, config.valid_size, config.seed)
        rows = numpy.setdiff1d(numpy.arange(len(prepared), dtype=numpy.int64), positions)
        val_data = ParallelData.from_flat(prepared.src, prepared.tgt, max_len=max_len, rows=positions,
                                          **special_ids(tokenizer))
        echo(f"--train: {config.valid_size:,} of its pairs held out for validation (chosen by seed {config.seed}); "
             "give --valid to validate on a corpus of your own")
    train_data = ParallelData.from_flat(prepared.src, prepared.tgt, max_len=max_len,
                                        max_ratio=config.max_ratio, rows=rows, **special_ids(tokenizer))
    return tokenizer, train_data, val_data, val_text


def build_model(config, tokenizer, rank=0):
    """The preset's Transformer (the paper's of its size with ``paper``) over the tokenizer's
    vocabulary with the run's dropout and model_overrides, initialised from the run's seed, on the
    run's device; restarts the dropout generator on ``rank``'s stream for the seed (``rank_seed``)."""
    overrides = {} if config.dropout is None else {"dropout": config.dropout}
    overrides.update(config.model_overrides or {})
    tf_random.manual_seed(distributed.rank_seed(config.seed, rank))
    shape = preset_config(config.preset, len(tokenizer), paper=config.paper, pad_id=tokenizer.pad_id,
                          max_len=max(config.max_len, 1024), seed=config.seed, **overrides)
    # sizes from flags, or a resumed checkpoint's config: within nn.limits' bounds before anything is built
    limits.check_buildable(shape, f"train: the model of preset {config.preset!r} with model_overrides "
                                  f"{config.model_overrides or {}}")
    return Transformer(shape).to(config.device)


def build_optimizer(config, model):
    """Adam (β₁ 0.9, β₂ 0.98, ε 1e-9, §5.3) on the run's schedule for ``model``'s d_model: Noam's, or
    the time budget's (whose elapsed fraction the Trainer sets)."""
    if config.schedule == "time":
        schedule = TimeBudgetSchedule(model.d_model, config.warmup_steps, config.lr_factor, config.decay_fraction)
    else:
        schedule = NoamSchedule(model.d_model, config.warmup_steps, config.lr_factor)
    return Adam(model.parameters(), lr=schedule, max_grad_norm=config.max_grad_norm)


def build_scaler(config):
    """fp16's dynamic loss scale (PyTorch GradScaler's defaults, ``loss_scale_window`` and
    ``min_loss_scale`` from the config); disabled, a pass-through, in fp32 and bf16."""
    return GradScaler(growth_interval=config.loss_scale_window, min_scale=config.min_loss_scale,
                      enabled=get_precision(config.precision).loss_scaling)
