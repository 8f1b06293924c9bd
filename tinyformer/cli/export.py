"""``tinyformer export``: a checkpoint's model in another format (safetensors, a Hugging Face Marian folder, or a
PyTorch nn.Transformer state dict)."""

from pathlib import Path

from .usage import UsageError

FORMATS = ("safetensors", "marian", "torch")


def register(commands):
    export = commands.add_parser(
        "export", help="write a checkpoint's model as safetensors, a Marian folder or a PyTorch state dict",
        description="Write the model of a checkpoint (or of a run directory's newest checkpoint) as a "
                    ".safetensors file: its parameters as named tensors, its model_config and tokenizer hash "
                    "in the file's metadata. translate, eval and explain take the file as they take a "
                    "checkpoint (the run's tokenizer beside it, or --tokenizer). --format marian: a folder "
                    "transformers' MarianMTModel and MarianTokenizer load (a Marian model: an imported run, "
                    "or one trained from it). --format torch: a PyTorch state dict (--output F.pt: torch.save "
                    "of tensors only; F.safetensors: the same tensors without torch) of tinyformer's Transformer "
                    "built with nn.Transformer (see the manual), and its model_config beside it as F.json, "
                    "which tinyformer import torch reads back.")
    export.add_argument("checkpoint", help="a checkpoint_*.npz (or an averaged one), or a run directory")
    export.add_argument("--format", choices=FORMATS, default="safetensors", help="the format (default safetensors)")
    export.add_argument("--output", help="the file to write (default: the checkpoint's name with .safetensors, "
                                         "beside it); with --format marian the folder to write (required); "
                                         "with --format torch the .pt, .pth or .safetensors file (required)")
    export.set_defaults(run=run)


def run(args):
    from ..translation import checkpoint
    from ..translation.train.state import migrated_with_model, model_check
    from ..translation.interop.staging import check_new_files
    from ..translation.weights import SAFETENSORS_SUFFIX, save_safetensors

    if args.format == "marian":
        from ..translation.interop.runs import export_marian

        if not args.output:
            raise UsageError("--format marian needs --output FOLDER")
        written = export_marian(args.checkpoint, args.output)
        print(f"wrote {written} (a Marian model folder) from {args.checkpoint}")
        return 0
    if args.format == "torch":
        from ..translation.interop.torch_runs import export_torch

        if not args.output:
            raise UsageError("--format torch needs --output F.pt (or .pth, .safetensors)")
        weights, config_file = export_torch(args.checkpoint, args.output)
        print(f"wrote {weights} (a PyTorch nn.Transformer state dict) and {config_file} (its model_config) "
              f"from {args.checkpoint}")
        return 0
    source = Path(args.checkpoint)
    if source.is_dir():
        found = checkpoint.list_checkpoints(source)
        if not found:
            raise FileNotFoundError(f"no checkpoint_*.npz in {source}")
        source = found[-1]
    output = Path(args.output) if args.output else source.with_suffix(SAFETENSORS_SUFFIX)
    if output.suffix != SAFETENSORS_SUFFIX:
        raise UsageError(f"--output {output}: a safetensors file's name ends in {SAFETENSORS_SUFFIX}")
    # An existing file is never replaced, whatever it holds, as --format marian and torch refuse theirs.
    check_new_files([output], "--output" if args.output else "the output (the checkpoint's name, .safetensors)")
    state, meta, _ = checkpoint.load_checkpoint(source, model_check(source))  # refused before its data
    save_safetensors(output, state, migrated_with_model(meta, source))
    print(f"wrote {output} ({len(state)} tensors) from {source}")
    return 0
