"""``tinyformer import``: a model of another framework as a tinyformer run (a Hugging Face Marian folder,
or a PyTorch nn.Transformer state dict)."""

from .usage import UsageError

KINDS = ("marian", "torch")


def register(commands):
    command = commands.add_parser(
        "import", help="turn a Hugging Face Marian model folder or a PyTorch state dict into a tinyformer run",
        description="Read a model of another framework and write it as a tinyformer run directory (a checkpoint "
                    "and its tokenizer) that translate, eval, explain, average and train --init-from take. "
                    "marian: a folder laid out as Helsinki-NLP/opus-mt-* on the Hugging Face Hub (config.json, "
                    "model.safetensors or pytorch_model.bin, source.spm, target.spm, vocab.json). "
                    "torch: a state dict of tinyformer's Transformer built in PyTorch (embed.weight and "
                    "nn.Transformer's own tensors; see the manual), as .pt/.pth (read with "
                    "torch.load(weights_only=True): tensors only, no code run) or .safetensors, with its "
                    "model_config JSON and the joint sentencepiece model it was trained with.")
    command.add_argument("kind", choices=KINDS, help="what the source is: marian (a Hugging Face MarianMTModel "
                                                     "folder) or torch (a PyTorch state dict file)")
    command.add_argument("source", help="the model folder (marian) or the state dict file (torch)")
    command.add_argument("--output", required=True, help="the run directory to write (new, or an empty folder)")
    command.add_argument("--model-config", metavar="JSON",
                         help="torch: the model's model_config (TransformerConfig.to_dict() as JSON; default: the "
                              "state dict's name with .json, as tinyformer export --format torch writes it)")
    command.add_argument("--tokenizer", metavar="SPM_MODEL",
                         help="torch (required): the joint sentencepiece model the model was trained with")
    command.set_defaults(run=run)


def run(args):
    if args.kind == "marian":
        from ..translation.interop.runs import import_marian

        for option in ("model_config", "tokenizer"):
            if getattr(args, option):
                raise UsageError(f"--{option.replace('_', '-')} is for import torch: a Marian folder holds its own")
        checkpoint, config, tokenizer = import_marian(args.source, args.output)
    else:
        from ..translation.interop.torch_runs import import_torch

        if not args.tokenizer:
            raise UsageError("import torch needs --tokenizer SPM_MODEL (the sentencepiece model it was trained with)")
        checkpoint, config, tokenizer = import_torch(args.source, args.output, args.tokenizer, args.model_config)
    encoder_layers, decoder_layers = config.depths
    print(f"imported {args.source} as {checkpoint}: {encoder_layers} encoder and {decoder_layers} decoder layers, "
          f"d_model {config.d_model}, {config.heads} heads, d_ff {config.d_ff}, {config.activation}, "
          f"{len(tokenizer):,} pieces")
    return 0
