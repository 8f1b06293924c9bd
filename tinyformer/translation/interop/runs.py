"""Marian models as tinyformer runs, and runs as Marian models: ``tinyformer import marian`` and
``tinyformer export --format marian`` (PyTorch state dicts: ``torch_runs.py``).

An imported run is a run directory like any other: ``checkpoint_0000000.npz`` (the weights, the
``model_config``, the tokenizer's hash; no optimiser state, like an averaged checkpoint) and the
tokenizer beside it, here a ``tokenizer/`` folder (``source.spm``, ``target.spm``, ``vocab.json``).
``translate``, ``eval``, ``explain``, ``average`` and ``train --init-from`` take it. It is built
in a temporary folder beside ``output`` and renamed into place whole (``staging.py``), so a refused
or interrupted import leaves nothing behind.
"""

import json
import shutil
from pathlib import Path

from ..checkpoint import non_finite, save_checkpoint
from .marian import MarianError, config_to_marian, read_marian_folder, state_to_marian
from .staging import IMPORTED_CHECKPOINT, build_beside, check_output, imported_metadata, newest_checkpoint

__all__ = ["MARIAN_TOKENIZER_DIR", "import_marian", "export_marian", "IMPORTED_CHECKPOINT"]

MARIAN_TOKENIZER_DIR = "tokenizer"
_TOKENIZER_EXTRAS = ("tokenizer_config.json",)


def import_marian(folder, output):
    """Write the Marian model of ``folder`` as a tinyformer run at ``output`` (a new or empty folder);
    returns (the checkpoint's path, the TransformerConfig, the tokenizer)."""
    folder = Path(folder)
    output = check_output(output, "--output", reading=folder)
    config, state, tokenizer, extras = read_marian_folder(folder)
    meta = imported_metadata(config, tokenizer, MARIAN_TOKENIZER_DIR,
                             {"kind": "marian", "folder": folder.name, **extras})

    def fill(staging):
        tokenizer_dir = staging / MARIAN_TOKENIZER_DIR
        tokenizer_dir.mkdir()
        for name in ("source.spm", "target.spm", "vocab.json") + _TOKENIZER_EXTRAS:
            if (folder / name).is_file():
                shutil.copyfile(folder / name, tokenizer_dir / name)
        save_checkpoint(staging / IMPORTED_CHECKPOINT, state, meta)

    build_beside(output, fill)
    return output / IMPORTED_CHECKPOINT, config, tokenizer


def export_marian(source, output, tokenizer_path=None):
    """Write the model of checkpoint (or run directory) ``source`` as a Marian folder at ``output`` (a
    new or empty folder) that transformers' ``MarianMTModel`` and ``MarianTokenizer`` load; the model
    must be a Marian model and its tokenizer a Marian one (an imported run, or one trained from it)."""
    from safetensors.numpy import save

    from ..data.marian_tokenizer import MarianTokenizer
    from ..train.state import load_model

    source = newest_checkpoint(source)
    output = check_output(output, "--output")
    model, tokenizer, meta = load_model(source, tokenizer_path=tokenizer_path)
    if not isinstance(tokenizer, MarianTokenizer):
        raise MarianError(f"{source}'s tokenizer is a joint sentencepiece model ({tokenizer.path.name}), not a "
                          "Marian one (source.spm, target.spm, vocab.json): only Marian runs export as Marian")
    found = non_finite(model.state_dict())  # as the other formats: no NaN or Inf leaves tinyformer
    if found is not None:
        name, bad, size = found
        raise MarianError(f"{source}: parameter {name!r} holds {bad} non-finite value(s) (NaN or Inf) of {size}: "
                          "a model holding them is not exported")
    config = model.config
    imported = meta.get("imported_from") or {}
    values = config_to_marian(config, tokenizer.eos_id, imported.get("config"))
    generation = dict(imported.get("generation_config") or {})
    generation.update({"decoder_start_token_id": tokenizer.pad_id, "pad_token_id": tokenizer.pad_id,
                       "eos_token_id": tokenizer.eos_id, "forced_eos_token_id": tokenizer.eos_id,
                       "bad_words_ids": [[tokenizer.pad_id]]})
    generation.setdefault("max_length", config.max_len)  # transformers' default, 20, would cut translations
    tensors = state_to_marian(model.state_dict(), config)

    def fill(staging):
        # written by open(), 0o666 less the umask (safetensors' save_file makes its file 0o600)
        (staging / "model.safetensors").write_bytes(save(tensors, metadata={"format": "pt"}))
        (staging / "config.json").write_text(json.dumps(values, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        (staging / "generation_config.json").write_text(json.dumps(generation, indent=2, sort_keys=True) + "\n",
                                                        encoding="utf-8")
        for name in ("source.spm", "target.spm", "vocab.json") + _TOKENIZER_EXTRAS:
            if (Path(tokenizer.path) / name).is_file():
                shutil.copyfile(Path(tokenizer.path) / name, staging / name)

    build_beside(output, fill)
    return output

