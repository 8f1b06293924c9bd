"""PyTorch state dicts as tinyformer runs, and runs as PyTorch state dicts: ``tinyformer import torch`` and
``tinyformer export --format torch`` (the layout: ``torch_transformer.py``).

An import reads three files: the weights (a ``.pt`` / ``.pth`` state dict, read only with
``torch.load(weights_only=True)``, or a ``.safetensors`` file, read without torch), the model's
``model_config`` as JSON (``TransformerConfig.to_dict()``; by default the weights' name with
``.json``, as the export writes it) and the run's joint sentencepiece model, whose vocabulary must
be the model's. It writes a run directory (``checkpoint_0000000.npz`` and ``spm.model``) whole or
not at all. An export writes the state dict (``torch.save`` of tensors only, or safetensors) and the
model_config beside it (``F.json``), both or neither.
"""

import json
import shutil
from pathlib import Path

import numpy

from ...common.files import readable_file
from ..checkpoint import save_checkpoint
from ..data.tokenizer import Tokenizer
from ..weights import SAFETENSORS_SUFFIX, load_weights
from .staging import (IMPORTED_CHECKPOINT, build_beside, check_output, imported_metadata, newest_checkpoint,
                      write_files_whole)
from .tensor_files import read_json, read_safetensors, read_torch_pickle, torch_declared
from .torch_transformer import TorchStateError, check_declared, from_torch_state, to_torch_state, torch_config

__all__ = ["TORCH_SUFFIXES", "import_torch", "export_torch", "config_file_of"]

TORCH_SUFFIXES = (".pt", ".pth")
_ADVICE = "save model.state_dict() itself (tensors only), or as .safetensors"


def config_file_of(weights):
    """The model_config JSON that goes with a weights file: its name with ``.json``, beside it."""
    return Path(weights).with_suffix(".json")


def import_torch(source, output, tokenizer_path, model_config_path=None):
    """Write the PyTorch state dict ``source`` (of the model ``model_config_path`` describes; default
    ``config_file_of(source)``) with tokenizer ``tokenizer_path`` as a tinyformer run at ``output`` (a
    new or empty folder); returns (the checkpoint's path, the TransformerConfig, the tokenizer)."""
    from ..train.state import TOKENIZER_FILE

    source = Path(source)
    output = check_output(output, "--output")
    readable_file(source, error=TorchStateError)
    if source.suffix not in TORCH_SUFFIXES + (SAFETENSORS_SUFFIX,):
        raise TorchStateError(f"{source}: a PyTorch state dict's file name ends in "
                              f"{', '.join(TORCH_SUFFIXES)} or {SAFETENSORS_SUFFIX}")
    config_path = Path(model_config_path) if model_config_path else config_file_of(source)
    if not config_path.exists() and not model_config_path:
        raise TorchStateError(f"--model-config {config_path} does not exist (the default: {source.name}'s name with "
                              ".json; name the model_config JSON with --model-config)")
    readable_file(config_path, "--model-config", TorchStateError)
    values = read_json(config_path, TorchStateError)
    if not isinstance(values, dict):
        raise TorchStateError(f"{config_path} must hold a model_config (a JSON object), got {type(values).__name__}")
    config = torch_config(values, str(config_path))
    tokenizer = Tokenizer(tokenizer_path)
    if len(tokenizer) != config.src_vocab_size:
        raise TorchStateError(f"--tokenizer {tokenizer_path} has {len(tokenizer)} pieces, but {config_path}'s "
                              f"src_vocab_size is {config.src_vocab_size}: not the model's tokenizer")
    if config.pad_id != tokenizer.pad_id:
        raise TorchStateError(f"{config_path}: pad_id={config.pad_id}, but a tinyformer tokenizer pads with id "
                              f"{tokenizer.pad_id}")
    if source.suffix == SAFETENSORS_SUFFIX:  # shapes and dtypes checked before any data is read
        tensors = read_safetensors(source, TorchStateError,
                                   lambda _, declared: check_declared(declared, config, str(source), config_path))
    else:
        tensors = read_torch_pickle(source, TorchStateError, _ADVICE)
        check_declared(torch_declared(tensors), config, str(source), config_path)
    state = {name: value.astype(numpy.float32, copy=False)
             for name, value in from_torch_state(tensors, config, str(source)).items()}
    meta = imported_metadata(config, tokenizer, TOKENIZER_FILE,
                             {"kind": "torch", "file": source.name, "model_config_file": config_path.name})

    def fill(staging):
        shutil.copyfile(tokenizer.path, staging / TOKENIZER_FILE)
        save_checkpoint(staging / IMPORTED_CHECKPOINT, state, meta)

    build_beside(output, fill)
    return output / IMPORTED_CHECKPOINT, config, tokenizer


def export_torch(source, output):
    """Write the model of checkpoint (or .safetensors export, or run directory) ``source`` as a PyTorch
    state dict at ``output`` (``.pt``/``.pth``: ``torch.save`` of tensors; ``.safetensors``) and its
    model_config at ``config_file_of(output)``; returns the two paths."""
    from ..train.state import migrated_with_model, model_check

    source, output = newest_checkpoint(source), Path(output)
    if output.suffix not in TORCH_SUFFIXES + (SAFETENSORS_SUFFIX,):
        raise TorchStateError(f"--output {output}: a PyTorch state dict's file name ends in "
                              f"{', '.join(TORCH_SUFFIXES)} or {SAFETENSORS_SUFFIX}")
    state, meta, _ = load_weights(source, model_check(source))
    config = torch_config(migrated_with_model(meta, source)["model_config"], f"{source}'s model_config")
    tensors = to_torch_state(state, config)
    from_torch_state(tensors, config, str(source))  # every tensor of its shape and finite: it imports back
    tensors = {name: numpy.ascontiguousarray(value, dtype=numpy.float32) for name, value in tensors.items()}
    if output.suffix == SAFETENSORS_SUFFIX:
        from safetensors.numpy import save

        def write_weights(path):  # into the file made for it (safetensors' save_file would make one of 0o600)
            path.write_bytes(save(tensors, metadata={"format": "pt"}))
    else:
        try:
            import torch
        except ImportError:
            raise TorchStateError(f"--output {output}: writing a .pt file needs torch (install it), or ask for "
                                  f"{output.with_suffix(SAFETENSORS_SUFFIX).name}") from None

        def write_weights(path):
            torch.save({name: torch.from_numpy(value) for name, value in tensors.items()}, str(path))

    def write_config(path):
        path.write_text(json.dumps(config.to_dict(), indent=2, sort_keys=True) + "\n", encoding="utf-8")

    return write_files_whole({output: write_weights, config_file_of(output): write_config})
