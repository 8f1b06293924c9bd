"""``tinyformer import``: a model of another framework as a tinyformer run (a Hugging Face Marian folder)."""

KINDS = ("marian",)


def register(commands):
    command = commands.add_parser(
        "import", help="turn a Hugging Face Marian model folder into a tinyformer run",
        description="Read a model of another framework and write it as a tinyformer run directory (a checkpoint "
                    "and its tokenizer) that translate, eval, explain, average and train --init-from take. "
                    "marian: a folder laid out as Helsinki-NLP/opus-mt-* on the Hugging Face Hub (config.json, "
                    "model.safetensors or pytorch_model.bin, source.spm, target.spm, vocab.json).")
    command.add_argument("kind", choices=KINDS, help="what the source is: marian (a Hugging Face MarianMTModel folder)")
    command.add_argument("source", help="the model folder")
    command.add_argument("--output", required=True, help="the run directory to write (new, or an empty folder)")
    command.set_defaults(run=run)


def run(args):
    from ..translation.interop.runs import import_marian

    checkpoint, config, tokenizer = import_marian(args.source, args.output)
    encoder_layers, decoder_layers = config.depths
    print(f"imported {args.source} as {checkpoint}: {encoder_layers} encoder and {decoder_layers} decoder layers, "
          f"d_model {config.d_model}, {config.heads} heads, d_ff {config.d_ff}, {config.activation}, "
          f"{len(tokenizer):,} pieces")
    return 0
