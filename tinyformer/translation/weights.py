"""A model's weights in safetensors, the field's format: the parameters as named tensors, and what
tinyformer needs to rebuild the model (its ``model_config``, the tokenizer's hash and file name) as
JSON in the file's metadata under ``"tinyformer"``. Read and written with the ``safetensors``
package (no pickle, no code run on loading); written atomically."""

import json
from pathlib import Path

import numpy

from ..common.atomic import replacing
from ..common.validation import json_type
from .checkpoint import CheckpointError, load_checkpoint, non_finite

__all__ = ["SAFETENSORS_SUFFIX", "METADATA_KEY", "save_safetensors", "load_safetensors", "load_weights"]

SAFETENSORS_SUFFIX = ".safetensors"
METADATA_KEY = "tinyformer"
KEPT = ("format", "model_config", "tokenizer_sha256", "tokenizer_file", "step", "config")  # of a checkpoint's metadata


def save_safetensors(path, model_state, metadata):
    """Write ``model_state`` ({name: array}) and the parts of ``metadata`` a model needs to ``path``;
    a parameter holding NaN or Inf is refused (CheckpointError, nothing written), as a checkpoint's is."""
    from safetensors.numpy import save

    tensors = {name: numpy.ascontiguousarray(value) for name, value in model_state.items()}
    found = non_finite(tensors)
    if found is not None:
        name, bad, size = found
        raise CheckpointError(f"refusing to write {path}: parameter {name!r} holds {bad} non-finite value(s) "
                              f"(NaN or Inf) of {size}")
    kept = {key: metadata[key] for key in KEPT if key in metadata}
    data = save(tensors, metadata={METADATA_KEY: json.dumps(kept, sort_keys=True), "format": "np"})
    path = Path(path)
    with replacing(path, prefix=path.name + ".", durable=True) as f:
        f.write(data)
    return path


def load_safetensors(path, check=None):
    """(model_state, metadata) of a file ``save_safetensors`` wrote; anything else is a CheckpointError
    naming the file and what is wrong with it. Read by the one safetensors reader
    (``interop.tensor_files.read_safetensors``): ``check(metadata, {name: (shape, dtype name)})`` sees
    the metadata and the tensors' headers before any tensor's data is read."""
    from .interop.tensor_files import read_safetensors

    path = Path(path)
    found = {}

    def read_header(header, declared):
        if METADATA_KEY not in header:
            raise CheckpointError(f"{path} is a safetensors file without tinyformer's metadata (no "
                                  f"{METADATA_KEY!r} entry): it was not written by tinyformer export")
        try:
            metadata = json.loads(header[METADATA_KEY])
        except json.JSONDecodeError as error:
            raise CheckpointError(f"{path}: its {METADATA_KEY!r} metadata is not JSON ({error})") from None
        if not isinstance(metadata, dict):
            raise CheckpointError(f"{path}: its {METADATA_KEY!r} metadata is a JSON {json_type(metadata)}, "
                                  "where an object belongs")
        if check is not None:
            check(metadata, declared)
        found["metadata"] = metadata

    state = read_safetensors(path, CheckpointError, read_header)
    return state, found["metadata"]


def load_weights(path, check=None):
    """(model_state, metadata, adam_state or None) of a checkpoint (.npz) or a .safetensors file; ``check``:
    see ``load_checkpoint`` (it sees the metadata and the parameters' headers before their data)."""
    if Path(path).suffix == SAFETENSORS_SUFFIX:
        return (*load_safetensors(path, check), None)
    return load_checkpoint(path, check)
