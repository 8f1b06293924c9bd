"""``tinyformer train``: one option per TrainConfig field, --resume, and the final test evaluation."""

from pathlib import Path

from ..engine import amp
from .eval import print_evaluation
from .options import checked, fit_beam
from .usage import UsageError


def register(commands):
    train = commands.add_parser(
        "train", help="train a translation model (default: `tiny` on the built-in task, on the CPU)",
        description="Train a Transformer with the paper's recipe; with no options, `tiny` on the "
                    "built-in synthetic English-German task, then evaluate it on its test split.")
    _add_train_options(train)
    train.add_argument("--resume", action="store_true",
                       help="continue the run in --save-dir from its newest checkpoint, exactly; only "
                            f"{', '.join(_resumable_flags())} may change")
    train.add_argument("--no-progress", action="store_true", help="no progress bar")
    train.add_argument("--no-test", action="store_true", help="skip the final test-set evaluation")
    train.set_defaults(run=run)


def run(args):
    from ..translation.train import Trainer, evaluate, load_corpus
    from ..translation.train.config import OPTIONS, ConfigError, TrainConfig

    given = {name: getattr(args, name) for name in OPTIONS if getattr(args, name, None) is not None}
    from ..translation.distributed.launch import launched_by_mpi, run_under_mpiexec

    try:
        config = _resumed_config(given) if args.resume else TrainConfig(**given)
        config.resolved()
    except ConfigError as error:
        raise UsageError(_flag_wording(error)) from None
    if (config.nproc or 1) > 1 and not launched_by_mpi():
        return run_under_mpiexec(config.nproc, args.argv)  # the same command, as nproc ranks
    try:
        trainer = Trainer(config, resume=args.resume, progress=not args.no_progress)
    except ConfigError as error:
        raise UsageError(_flag_wording(error)) from None
    trainer.run()
    if not trainer.lead:  # rank 0 tells where the run is and evaluates it
        return 0
    print(f"checkpoints, tokenizer and metrics.jsonl are in {trainer.save_dir}")
    if args.no_test:
        return 0
    if trainer.config.data == "files" and trainer.config.test_data is None:
        print("no --test corpus was given: no test evaluation")
        return 0
    sources, references = load_corpus(trainer.config, "test")
    model, averaged = trainer.model, trainer.averaged
    if averaged is not None:  # --average-last: the average is what is tested
        model = averaged.model
        print(f"test, {averaged.label()}")
    with amp.autocast(trainer.config.precision):
        beam = fit_beam(trainer.config.beam_size, model, trainer.tokenizer, args.command)
        result = evaluate(model, trainer.tokenizer, sources, references, beam, trainer.config.alpha)
    print_evaluation(result, sources, references, "test")
    trainer.log({"step": trainer.step, "split": "test", **({"averaged": averaged.count} if averaged else {}),
                 **{k: v for k, v in result.items() if k != "hypotheses"}})
    return 0


def _resumed_config(given):
    """The config saved in the run's newest checkpoint, with the given options that --resume may
    change applied; the others may only repeat the saved values."""
    from ..translation.train.config import OPTIONS, RESUMABLE, flag_of

    config = _saved_config(Path(given.get("save_dir") or _default_save_dir(given)))

    def as_saved(name, value):  # a relative corpus path given again names the saved absolute one
        check = OPTIONS[name].check
        try:
            return check(name, value) if check else value
        except ValueError:
            return value

    changed = [flag_of(name) for name, value in given.items()
               if name not in RESUMABLE and as_saved(name, value) != getattr(config, name)]
    if changed:
        raise UsageError(f"--resume continues the saved run: {', '.join(changed)} cannot change (only "
                         f"{', '.join(_resumable_flags())} can)")
    for name, value in given.items():
        setattr(config, name, value)
    return config


def _resumable_flags():
    from ..translation.train.config import RESUMABLE, flag_of

    return sorted(flag_of(name) for name in RESUMABLE)


def _flag_wording(error):
    """A TrainConfig's ConfigError in the command line's words: the flag where it names the field."""
    from ..translation.train.config import flag_of

    message, flag = str(error), flag_of(error.field)
    return flag + message[len(error.field):] if flag and message.startswith(error.field) else message


def _default_save_dir(given):
    from ..translation.train.config import default_save_dir

    data = given.get("data") or ("files" if given.get("train_data") else "synthetic")
    return default_save_dir(data, given.get("preset"), given.get("init_from"))


def _saved_config(save_dir):
    from ..translation import checkpoint
    from ..translation.train import TrainConfig

    paths = checkpoint.list_checkpoints(save_dir)
    if not paths:
        raise FileNotFoundError(f"--resume: no checkpoint_*.npz in {save_dir}")
    from ..translation.train.state import model_check

    # its model_config within nn.limits' bounds and its parameters' headers that model's, before any data is read
    _, meta, _ = checkpoint.load_checkpoint(paths[-1], model_check(paths[-1]))
    if not isinstance(meta.get("config"), dict):
        raise checkpoint.CheckpointError(f"--resume: checkpoint {paths[-1]} holds no run config (a JSON object) "
                                         "in its metadata: it was not written by tinyformer train")
    return TrainConfig.from_dict(meta["config"], meta.get("model_config"))


def _add_train_options(parser):
    """One option per TrainConfig field that has a flag: its type, check and help (with the real
    default) come from the field's declaration."""
    from ..translation.train.config import DEFAULTS, OPTIONS, flag_of

    for name, option in OPTIONS.items():
        if not flag_of(name):
            continue
        help_text = _option_help(option, DEFAULTS[name]).replace("%", "%%")
        if option.kind is bool:  # a switch: given means True
            parser.add_argument(flag_of(name), dest=name, action="store_const", const=True, default=None,
                                help=help_text)
        else:
            kind = str if option.kind is str else checked(option.kind, option.check)
            parser.add_argument(flag_of(name), dest=name, type=kind, default=None, help=help_text)


def _option_help(option, default):
    """The field's help text with the values it takes and its default: "... (default 1)",
    "... (default 600 for synthetic, 8000 for multi30k)", "... (default: no clipping)"."""
    def shown(value):
        return option.unset if value is None else str(value)

    notes = []
    if isinstance(option.choices, dict):
        notes.append("; ".join(f"{', '.join(values) if values else 'any language code'} for {data}"
                               for data, values in option.choices.items()))
    elif option.choices:
        notes.append(", ".join(option.choices))
    if option.per_data:
        notes.append("default " + ", ".join(f"{shown(v)} for {data}" for data, v in option.per_data.items()))
    else:
        notes.append(f"default: {option.unset}" if default is None else f"default {default}")
    return f"{option.help} ({'; '.join(notes)})"
