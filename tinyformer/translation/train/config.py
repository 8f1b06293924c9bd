"""TrainConfig: every option of a training run, each declared once with all that is known of it.

A field's ``Option`` holds its default (or one per data set), its help text, its command-line
flag, whether ``--resume`` may change it, its check, and the Transformer argument it stands for.
The command line (its flags, types, help texts and the ``--resume`` rule), ``resolved()``'s
checks, the refusals of ``model_overrides`` and the settings ignored when two models' architectures
are compared are all derived from these declarations. Where the value of a field that was not
given comes from (a recipe, the model of ``--init-from``, the data set, the field's own default)
is ``default_value``'s one rule.
"""

import dataclasses
import functools
import os
from pathlib import Path

from ...engine import backend
from ...engine.kernels import paths
from ...engine.amp import PRECISIONS
from ..distributed import COMMS
from ..data.corpus import LANGUAGE_CODE
from ..data.multi30k import LANGUAGES as MULTI30K_LANGUAGES
from ...model.nn import TransformerConfig
from ...model.nn.presets import PRESETS, check_preset
from .migration import migrate_config
from .recipes import RECIPES
from ...common.validation import check_int, check_probability, check_real
from ..length_penalties import ALPHA_LIMIT

__all__ = ["TrainConfig", "Option", "ConfigError", "OPTIONS", "DEFAULTS", "default_value", "RESUMABLE", "RUN_SET", "TRAINING_ONLY",
           "DATASETS", "LANGUAGES", "MODEL_DEFINING", "flag_of", "default_save_dir", "check_languages",
           "check_model_overrides", "SCHEDULES"]

# "files": a corpus of one's own (--train PREFIX), in any two languages (LANGUAGES None).
DATASETS = ("synthetic", "multi30k", "files")
SCHEDULES = ("noam", "time")
LANGUAGES = {"synthetic": ("en", "de"), "multi30k": MULTI30K_LANGUAGES, "files": None}

# Checks of tinyformer.common.validation: check(name, value) returns the value or raises a ValueError
# "NAME must be ..., got VALUE".
positive_int = functools.partial(check_int, minimum=1)
non_negative_int = functools.partial(check_int, minimum=0)
positive_real = functools.partial(check_real, minimum=0, open_minimum=True)
unit_interval = functools.partial(check_real, minimum=0, maximum=1)
at_least_one = functools.partial(check_real, minimum=1)


class ConfigError(ValueError):
    """A TrainConfig value that ``resolved()`` refuses. The message starts with the field's name
    (``field``) where it names it; the command line puts the field's flag in its place."""

    def __init__(self, field, message):
        super().__init__(message)
        self.field = field


@dataclasses.dataclass(frozen=True)
class Option:
    """What is known of one TrainConfig field; ``default_value`` says which of its defaults applies."""

    help: str
    default: object = None    # the field's own default (where per_data does not give one)
    kind: type = str          # what the command line parses its text as
    check: object = None      # check(name, value) -> value; a ValueError names ``name``
    per_data: dict = None     # {data set: default} where the default depends on the data
    unset: str = None         # what None means after resolving; a field without it is never None
    choices: object = None    # the values it takes (a tuple, or one tuple per data set), for the help
    flag: str = None          # the command-line option; None: --field-name; "": not on the command line
    resumable: bool = False   # --resume may change it: it does not change what is trained
    model_argument: tuple = ()  # the Transformer arguments it stands for: the run's, never model_overrides'
    training_only: bool = False  # they shape no parameter: models differing in them share an architecture
    recipe: bool = False      # a recipe (recipes.RECIPES) may set it: None in the dataclass until resolved()


def option(default=None, **facts):
    """A TrainConfig field and its Option. The dataclass holds ``default`` itself, but None for a field
    a recipe may set, so that ``resolved()`` can tell a value given (which wins) from none."""
    facts = Option(default=default, **facts)
    return dataclasses.field(default=None if facts.recipe else default, metadata={"option": facts})


def _one_of(choices):
    """A check that ``value`` is one of ``choices`` (a sequence or a dict's keys), naming them."""
    def check(name, value):
        if value not in choices:
            raise ValueError(f"{name} must be one of {tuple(choices)}, got {value!r}")
        return value
    return check


_check_data = _one_of(DATASETS)
_check_schedule = _one_of(SCHEDULES)
_check_recipe = _one_of(RECIPES)
decay_interval = functools.partial(check_real, minimum=0, maximum=1, open_minimum=True)


def _check_preset(name, value):
    return check_preset(value)


def _corpus_path(name, value):
    """A corpus prefix or file, made absolute: the run finds it again from any directory."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} must name a corpus (a file prefix or a tab-separated file), got {value!r}")
    return os.path.abspath(os.path.expanduser(value))


def _run_path(name, value):
    """A run directory or checkpoint file, made absolute (its existence is checked when the run starts)."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} must name a run directory or a checkpoint file, got {value!r}")
    return os.path.abspath(os.path.expanduser(value))


def _plain_name(name, value):
    if not isinstance(value, str) or Path(value).name != value or value in (".", ".."):
        raise ValueError(f"{name} must be a plain file or folder name, got {value!r}")
    return value


def _check_device(name, value):
    return backend.check_device(value)


_check_precision = _one_of(PRECISIONS)
_check_comm = _one_of(COMMS)
CUDA_GRAPHS = ("on", "off")
_check_cuda_graphs = _one_of(CUDA_GRAPHS)


def check_model_overrides(name, overrides):
    """``model_overrides``: a dict of Transformer arguments that change the preset's model, none of
    them one that the run sets from its own fields (or the tokenizer)."""
    if not isinstance(overrides, dict):
        raise ValueError(f"{name} must be a dict of Transformer arguments, got {overrides!r}")
    allowed = sorted(set(TransformerConfig.field_names()) - set(RUN_SET))
    for key in overrides:
        if key in RUN_SET:
            field = RUN_SET[key]
            raise ValueError(f"{name}: {key!r} is set by the run" + (f"; use TrainConfig.{field}" if field else ""))
        if key not in allowed:
            raise ValueError(f"{name}: unknown Transformer argument {key!r}; allowed: {', '.join(allowed)}")
    return overrides


@dataclasses.dataclass
class TrainConfig:
    """Everything that defines a run; saved in every checkpoint. ``None`` means the default (the
    data's, where it depends on the data); ``resolved()`` fills the defaults in and checks it all."""

    data: str = option("synthetic", help="the training data", choices=DATASETS, check=_check_data)
    src_lang: str = option("en", help="source language", flag="--src", choices=LANGUAGES)
    tgt_lang: str = option("de", help="target language", flag="--tgt", choices=LANGUAGES)
    data_dir: str = option(help="directory holding the Multi30k files", resumable=True,
                           unset="$TINYFORMER_DATA, the user cache, or a download")
    # A corpus of one's own, named as fairseq names one (--trainpref): PREFIX.<src> and PREFIX.<tgt>.
    train_data: str = option(help="train on your own corpus: PREFIX.<src> and PREFIX.<tgt> (plain or .gz, one "
                             "sentence per line) or a tab-separated file; sets --data files", flag="--train",
                             unset="none", check=_corpus_path)
    valid_data: str = option(help="validation corpus of --train, named as --train", flag="--valid",
                             unset="--valid-size pairs held out of --train", check=_corpus_path)
    test_data: str = option(help="test corpus of --train for the final evaluation, named as --train", flag="--test",
                            unset="none: no test evaluation", check=_corpus_path, resumable=True)
    valid_size: int = option(1000, help="without --valid: pairs held out of --train for validation (chosen by --seed)",
                             kind=int, check=positive_int)
    max_ratio: float = option(help="drop training pairs whose longer side has more than this many times the "
                              "subwords of the shorter one (Moses' clean-corpus rule)",
                              per_data={"synthetic": None, "multi30k": None, "files": 9.0}, unset="no limit",
                              kind=float, check=at_least_one)
    dedup: bool = option(False, help="drop exact repeats of a training pair of --train", kind=bool)
    tokenizer_sample: int = option(1_000_000, help="train the BPE on at most this many sentences of --train, "
                                   "sampled with --seed", kind=int, check=positive_int)
    corpus_cache: str = option(help="where the prepared corpora of --train are kept, shared by runs and ranks",
                               unset="corpus-cache beside --save-dir", resumable=True)
    # What the run was trained on: {"--train": {path: SHA-256}, ...}, set when it starts.
    data_files: dict = option(help="the corpus files of the run and their SHA-256", unset="none", kind=dict, flag="")
    # The built-in task: `tiny` reaches >= 95% exact match in a few CPU minutes; Multi30k: `small`.
    preset: str = option(help="model size", per_data={"synthetic": "tiny", "multi30k": "small", "files": "small"},
                         choices=tuple(PRESETS), check=_check_preset)
    # Fine-tuning (docs/training.md#fine-tune-a-model): another run's model, weights and tokenizer; the
    # fields of MODEL_DEFINING cannot be given with it.
    init_from: str = option(help="fine-tune: start from this run's model and weights (its newest checkpoint, or "
                            "the checkpoint named) with its tokenizer, copied into --save-dir (no BPE is "
                            "trained); fresh Adam and schedule from step 0; --preset, --paper and --vocab-size "
                            "cannot be given with it", unset="none: a new model", check=_run_path)
    # The name of the run's tokenizer in save_dir where it is not spm.model: that of the --init-from run's.
    tokenizer_file: str = option(help="the name of the run's tokenizer in --save-dir, set by --init-from",
                                 unset="spm.model", flag="", check=_plain_name)
    # The preset with none of the options the paper does not have (nn.PAPER_CHOICES), for runs that
    # must be the paper's model; model_overrides still apply over it.
    paper: bool = option(False, help="the paper's exact model of the preset's size: none of the preset's choices "
                         "that the paper does not make (nn.PAPER_CHOICES)", kind=bool)
    # A joint BPE (§5.1: one source-target vocabulary, 37k for WMT): 8k for Multi30k's 29k pairs.
    vocab_size: int = option(help="joint BPE vocabulary size",
                             per_data={"synthetic": 600, "multi30k": 8000, "files": 8000},
                             kind=int, check=positive_int, model_argument=("src_vocab_size", "tgt_vocab_size"))
    # §5.1 batches 25k source + 25k target tokens; a CPU or one small GPU takes a few thousand.
    max_tokens: int = option(help="padded tokens per batch",
                             per_data={"synthetic": 2048, "multi30k": 4096, "files": 4096},
                             kind=int, check=positive_int)
    accum: int = option(1, help="batches per optimiser step and rank, for gradient accumulation (a step takes "
                        "nproc × accum batches)", kind=int, check=positive_int)
    max_steps: int = option(help="optimiser steps to train for",
                            per_data={"synthetic": 1000, "multi30k": 3000, "files": 3000},
                            kind=int, check=positive_int, resumable=True, recipe=True)
    max_epochs: int = option(help="stop after this many epochs as well", unset="no limit", kind=int,
                             check=positive_int, resumable=True)
    # §5.3 warms up over 4,000 of 100,000 steps; these short runs over their first 20-27 %.
    warmup_steps: int = option(help="warm-up steps of the learning-rate schedule, §5.3",
                               per_data={"synthetic": 200, "multi30k": 800, "files": 800},
                               kind=int, check=positive_int, recipe=True)
    lr_factor: float = option(help="Noam factor: lr = factor * d_model^-0.5 * min(...) (the peak of --schedule "
                              "time is Noam's: factor * d_model^-0.5 * warmup^-0.5)", default=1.0, kind=float,
                              check=positive_real, recipe=True)
    schedule: str = option(help="the learning-rate schedule: noam (§5.3: warm-up, then 1/sqrt(step)) or time "
                           "(warm-up to Noam's peak, then linear decay to 0 at the end of --time-limit; needs "
                           "--time-limit)", default="noam", choices=SCHEDULES, check=_check_schedule,
                           recipe=True)
    decay_fraction: float = option(help="--schedule time: the last fraction of --time-limit over which the learning "
                                   "rate falls linearly to 0 (constant at the peak before it)", default=1.0,
                                   kind=float, check=decay_interval, recipe=True)
    recipe: str = option(help="a named set of defaults for the options not given: hour (one hour of a CPU; see "
                         "docs/training.md)", unset="none", choices=tuple(RECIPES), check=_check_recipe)
    # §5.4: label smoothing of 0.1 hurts perplexity but improves accuracy and BLEU. A property of the
    # loss; named as a model argument because older checkpoints' model_config held it (so it is
    # ignored when architectures are compared) and model_overrides should point here.
    label_smoothing: float = option(0.1, help="label smoothing ε of the loss, §5.4", kind=float,
                                    check=unit_interval, model_argument=("label_smoothing",), training_only=True)
    dropout: float = option(help="residual and embedding dropout, §5.4", unset="the preset's", kind=float,
                            check=check_probability, model_argument=("dropout",), training_only=True)
    model_overrides: dict = option(help="Transformer arguments over the preset's, e.g. {'heads': 8, "
                                   "'positional': 'learned'} or PyTorch nn.Transformer's extras {'attention_dropout': "
                                   "0.1, 'activation_dropout': 0.1, 'final_norm': True, 'init': 'torch'}",
                                   unset="none", kind=dict, flag="",
                                   check=check_model_overrides)
    max_len: int = option(256, help="drop training pairs longer than this many tokens", kind=int,
                          check=positive_int, model_argument=("max_len",))
    max_grad_norm: float = option(help="clip the global gradient norm to this", unset="no clipping", kind=float,
                                  check=positive_real)
    max_bad_steps: int = option(5, help="stop after this many updates in a row skipped for a non-finite loss "
                                "or gradient", kind=int, check=positive_int, resumable=True)
    seed: int = option(0, help="seed for initialisation, data order and dropout", kind=int, check=non_negative_int,
                       model_argument=("seed",), training_only=True)
    # The synthetic task's matrices are too small to gain from more BLAS threads, and spinning ones
    # slow down many-fold on a machine whose other core is busy.
    threads: int = option(help="BLAS threads", per_data={"synthetic": 1, "multi30k": None, "files": None}, unset="all",
                          kind=int, check=positive_int, resumable=True)
    device: str = option("cpu", help="where to train", choices=backend.DEVICES, check=_check_device, resumable=True)
    # Mixed precision (docs/mixed-precision.md): the master weights and Adam's moments stay fp32.
    precision: str = option("fp32", help="arithmetic of the matrix products and attention: fp32, or bf16/fp16 with "
                            "fp32 master weights (fp16 with dynamic loss scaling)", choices=tuple(PRECISIONS),
                            check=_check_precision)
    # PyTorch GradScaler's growth interval; fairseq's --min-loss-scale floor.
    loss_scale_window: int = option(2000, help="fp16: double the loss scale after this many steps without overflow",
                                    kind=int, check=positive_int)
    min_loss_scale: float = option(1e-4, help="fp16: stop the run when overflows push the loss scale below this",
                                   kind=float, check=positive_real, resumable=True)
    # Data parallelism (docs/distributed.md). nproc is the run's world size: it
    # sets how many batches a step takes, so --resume keeps it.
    nproc: int = option(help="data-parallel processes: run under mpiexec -n N (started for you when tinyformer "
                        "train is not already one rank of an MPI launch)", unset="1, or the size of the MPI launch",
                        kind=int, check=positive_int)
    comm: str = option(help="how the ranks sum their gradients: mpi (mpi4py; GPU arrays through host memory) or "
                       "nccl (cupy.cuda.nccl, GPU arrays)", unset="nccl for --device cuda when NCCL loads, else mpi",
                       choices=COMMS, check=_check_comm, resumable=True)
    # PyTorch DDP's default: large enough for the all-reduce to run near full bandwidth, small
    # enough for the first buckets to start while the backward pass still has layers to go.
    bucket_mb: float = option(25.0, help="MiB of gradients per all-reduce bucket, started during the backward pass",
                              kind=float, check=positive_real, resumable=True)
    comm_timeout: float = option(300.0, help="seconds a collective may wait for the other ranks before the run "
                                 "stops with a message", kind=float, check=positive_real, resumable=True)
    check_every: int = option(100, help="compare a checksum of every rank's parameters every N steps",
                              kind=int, check=positive_int, resumable=True)
    # docs/cuda-graphs.md: off by default until a GPU run has confirmed them (issue 17).
    cuda_graphs: str = option("off", help="on: capture each batch shape's whole training step into a CUDA graph "
                              "and replay it (GPU, one process); off: run every op eagerly", choices=CUDA_GRAPHS,
                              check=_check_cuda_graphs, resumable=True)
    shape_multiple: int = option(8, help="--cuda-graphs on: pad batch lengths up to a multiple of this (fewer shapes, "
                                 "fewer graphs)", kind=int, check=positive_int, resumable=True)
    patience: int = option(help="stop when this many validations in a row have not improved the best greedy BLEU",
                           unset="never", kind=int, check=positive_int, resumable=True)
    time_limit: float = option(help="stop training after this many minutes (then save and evaluate as at "
                               "max_steps): with --schedule noam, minutes of this invocation; with --schedule time, "
                               "of the whole run, the parts before a --resume included", unset="no limit",
                               kind=float, check=positive_real, resumable=True, recipe=True)
    save_dir: str = option(help="checkpoints, tokenizer and metrics.jsonl go here", unset="runs/<data>-<preset>",
                           resumable=True)
    save_every: int = option(500, help="checkpoint every N steps and at the end", kind=int, check=positive_int,
                             resumable=True)
    save_every_minutes: float = option(help="also checkpoint when this many minutes of training have passed since "
                                       "the last checkpoint", unset="off", kind=float, check=positive_real,
                                       resumable=True, recipe=True)
    keep_last: int = option(5, help="keep the newest K checkpoints (at least --average-last)", kind=int,
                            check=positive_int, resumable=True)
    average_last: int = option(help="when training ends, average the last N checkpoints into averaged.npz in "
                               "--save-dir, validate it and test it", unset="no averaging", kind=int,
                               check=positive_int, resumable=True, recipe=True)
    eval_every: int = option(help="validate every N steps: loss, perplexity, greedy BLEU", default=500,
                             kind=int, check=positive_int, resumable=True, recipe=True)
    eval_every_minutes: float = option(help="also validate when this many minutes of training have passed since "
                                       "the last validation", unset="off", kind=float, check=positive_real,
                                       resumable=True, recipe=True)
    log_every: int = option(10, help="append training metrics to metrics.jsonl every N steps", kind=int,
                            check=positive_int, resumable=True)
    bleu_samples: int = option(500, help="validation sentences translated for BLEU", kind=int, check=positive_int,
                               resumable=True)
    beam_size: int = option(4, help="beam size of the final test evaluation, §6.1", flag="--beam", kind=int,
                            check=positive_int, resumable=True)
    alpha: float = option(0.6, help=f"length penalty α of the final test evaluation, §6.1, in [0, {ALPHA_LIMIT}]",
                          kind=float, check=functools.partial(check_real, minimum=0, maximum=ALPHA_LIMIT),
                          resumable=True)

    def resolved(self):
        """A copy with every field not given set to its default (``default_value``) and every field
        checked (ConfigError names the field)."""
        values = {}
        data = self.data
        if self.train_data is not None and data in (None, "synthetic"):
            data = "files"  # --train names the data
        if self.init_from is not None:
            _check_init_from(self)
        elif self.tokenizer_file is not None:
            raise ConfigError("tokenizer_file", "tokenizer_file is set by --init-from (the name its run gave its "
                              "tokenizer), not given alone")
        if self.recipe is not None:
            _checked("recipe", OPTIONS["recipe"], self.recipe)
        for name, opt in OPTIONS.items():  # in declaration order: data, preset and init_from before save_dir
            value = data if name == "data" else getattr(self, name)
            if value is None:
                value = default_value(name, self, values)
            values[name] = value if value is None or opt.check is None else _checked(name, opt, value)
        check_languages(values["data"], values["src_lang"], values["tgt_lang"])
        if values["data"] == "files" and values["train_data"] is None:
            raise ConfigError("data", "data 'files' needs the corpus: give --train PREFIX")
        for name in ("train_data", "valid_data", "test_data"):
            if values[name] is not None and values["data"] != "files":
                raise ConfigError(name, f"{name} is a corpus of your own, which replaces --data {values['data']}: "
                                  "give one of them")
        if values["device"] == "cuda":  # bf16 below sm_80: refused here, before any work (kernels.paths)
            capability = backend.compute_capability()
            if problem := paths.precision_problem(capability, values["precision"], backend.device_name()):
                raise ConfigError("precision", problem)
        if values["schedule"] == "time" and values["time_limit"] is None:
            raise ConfigError("schedule", "schedule 'time' ends the learning rate with the time limit: give "
                              "--time-limit MINUTES")
        if values["schedule"] != "time" and values["decay_fraction"] not in (None, 1.0):
            raise ConfigError("decay_fraction", f"decay_fraction {values['decay_fraction']:g} shapes the decay of "
                              f"schedule 'time' only, not of schedule '{values['schedule']}': give --schedule time "
                              "(with --time-limit) or leave it out")
        return TrainConfig(**values)

    def to_dict(self):
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values, model_config=None):
        """The config a checkpoint holds, brought to today's fields by ``migration.migrate_config``
        (with the checkpoint's ``model_config``: pinned to the model it trained); keys of no field
        are left out."""
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in migrate_config(values, model_config).items() if k in known})


def default_value(name, config, resolved):
    """The value field ``name`` of ``config`` (a TrainConfig) takes when it was not given: the one place
    that says where a default comes from. ``resolved``: the fields resolved so far. The first that applies:

    1. the recipe's (``--recipe``: ``recipes.RECIPES``);
    2. none, for a field that would define a new model (``MODEL_DEFINING``) of a run ``--init-from``
       another: that run's checkpoint is the model (``init_from.py``);
    3. the data set's: ``Option.per_data``, and save_dir's ``runs/<data>-<preset>`` (``default_save_dir``);
    4. the field's own, ``Option.default``.

    A value that stays None means what its ``Option.unset`` says (dropout: the preset's, or the
    ``--init-from`` model's)."""
    if config.recipe is not None and name in RECIPES[config.recipe]:
        return RECIPES[config.recipe][name]
    if config.init_from is not None and name in MODEL_DEFINING:
        return None
    if name == "save_dir":
        return default_save_dir(resolved["data"], resolved["preset"], resolved["init_from"])
    option = OPTIONS[name]
    return option.per_data[resolved["data"]] if option.per_data else option.default


def _check_init_from(config):
    """The model of a run --init-from another is that run's: the fields that would define another are refused,
    naming the first given."""
    for name in MODEL_DEFINING:
        if getattr(config, name) not in (None, False, {}):
            raise ConfigError(name, f"{name} cannot be given with --init-from, whose checkpoint defines the model "
                              "(its model_config and tokenizer); --dropout still applies")


OPTIONS = {f.name: f.metadata["option"] for f in dataclasses.fields(TrainConfig)}
# Each field's own default (per_data's where None; see default_value)
DEFAULTS = {name: opt.default for name, opt in OPTIONS.items()}
RESUMABLE = frozenset(name for name, opt in OPTIONS.items() if opt.resumable)
# The fields that define a new model, which a run --init-from another takes from its checkpoint instead.
MODEL_DEFINING = ("preset", "paper", "vocab_size", "model_overrides")
# Transformer arguments the run sets (from the field named, or from the tokenizer for None).
RUN_SET = {argument: name for name, opt in OPTIONS.items() for argument in opt.model_argument} | {"pad_id": None}
# Transformer arguments that shape no parameter: models differing only in them share an architecture
# (``init`` only says how the weights were first drawn).
TRAINING_ONLY = frozenset({"attention_dropout", "activation_dropout", "init"}.union(
    *(opt.model_argument for opt in OPTIONS.values() if opt.training_only)))


def _checked(name, opt, value):
    try:
        return opt.check(name, value)
    except ValueError as error:
        raise ConfigError(name, str(error)) from None


def flag_of(name):
    """The command-line option of field ``name`` (None for a field the command line does not set)."""
    flag = OPTIONS[name].flag
    return "--" + name.replace("_", "-") if flag is None else flag or None


def default_save_dir(data="synthetic", preset=None, init_from=None):
    """runs/<data>-<preset>, or runs/<data>-from-<run> for a run --init-from another: where a run keeps its
    files unless told otherwise."""
    data = _checked("data", OPTIONS["data"], data)
    if init_from is not None:
        source = Path(init_from)
        run = source.parent if source.suffix in (".npz", ".safetensors") else source
        return str(Path("runs") / f"{data}-from-{run.name}")
    return str(Path("runs") / f"{data}-{preset or OPTIONS['preset'].per_data[data]}")


def check_languages(data, src_lang, tgt_lang):
    """Both languages must be ones the data has (any language code for a corpus of one's own), and
    differ (before a tokenizer is trained)."""
    data = _checked("data", OPTIONS["data"], data)
    for name, lang in (("src_lang", src_lang), ("tgt_lang", tgt_lang)):
        if LANGUAGES[data] is None:
            if not isinstance(lang, str) or not LANGUAGE_CODE.fullmatch(lang):
                raise ConfigError(name, f"{name} {lang!r} is not a language code: two or three lowercase letters "
                                  "and an optional variant, such as en, de, pt_BR or zh-Hans")
        elif lang not in LANGUAGES[data]:
            raise ConfigError(name, f"{name} {lang!r}: the {data} data has the languages {', '.join(LANGUAGES[data])}")
    if src_lang == tgt_lang:
        raise ConfigError("tgt_lang", f"source and target language are both {src_lang!r}")
