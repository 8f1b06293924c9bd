"""Weight files of other frameworks read safely, for every importer (Marian folders, PyTorch state dicts).

``.safetensors`` is read with the ``safetensors`` package (no torch needed); a PyTorch pickle
(``.bin``, ``.pt``, ``.pth``) only with ``torch.load(weights_only=True)``, which runs no code from
the file: a pickle of anything but plain tensors is refused. Each failure is an ``InteropError``
(a ValueError; each importer has its own subclass) of one line naming the file, or the tensor. A file
that cannot be opened is said to be missing, a folder or not readable (``common.files``), never corrupt.
A safetensors file's header (its metadata and each tensor's shape and dtype) is read and checked
(``check``) before any tensor's data: the one reader of safetensors for imports and checkpoints alike.
"""

import json

import numpy

from ...common.files import read_bytes, readable_file

__all__ = ["InteropError", "float_array", "read_json", "read_safetensors", "read_torch_pickle", "torch_declared",
           "SAFETENSORS_DTYPES"]

#: safetensors' dtype names as NumPy's (bfloat16 has no NumPy dtype: it is widened where read)
SAFETENSORS_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
                      "I32": "int32", "I16": "int16", "I8": "int8", "U64": "uint64", "U32": "uint32", "U16": "uint16",
                      "U8": "uint8", "BOOL": "bool"}


class InteropError(ValueError):
    """A foreign model tinyformer cannot read or build, or a model it cannot write in a foreign format."""


def float_array(value, name="a tensor", error=InteropError):
    """A NumPy array of a tensor read from safetensors or torch: float32 and float64 kept, bfloat16 and
    float16 widened to float32; integer or boolean tensors (``name``) refused with ``error``."""
    if hasattr(value, "detach"):  # a torch tensor (so torch is there)
        import torch

        value = value.detach().cpu()
        value = (value.float() if value.dtype in (torch.float16, torch.bfloat16) else value).numpy()
    value = numpy.asarray(value)
    if value.dtype.name in ("bfloat16", "float16"):
        value = value.astype(numpy.float32)
    if value.dtype not in (numpy.float32, numpy.float64):
        raise error(f"{name} has dtype {value.dtype}, where floating-point weights belong")
    return value


def read_json(path, error=InteropError):
    """The JSON value of file ``path``; ``error`` names the file when it is unreadable or not JSON."""
    data = read_bytes(path, error=error)
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as problem:
        raise error(f"{path} is not JSON ({problem})") from None


def read_safetensors(path, error=InteropError, check=None, metadata=False):
    """{name: NumPy array} of a .safetensors file (with ``metadata``: and its header's metadata, a dict
    of strings). ``check(metadata, {name: (shape, dtype name)})`` sees the header before any data is read:
    what it raises stops the reading."""
    from safetensors import SafetensorError, safe_open

    readable_file(path, error=error)
    try:
        with safe_open(str(path), framework="np") as f:
            header = f.metadata() or {}
            declared = {}
            for name in f.keys():
                tensor = f.get_slice(name)
                declared[name] = (tuple(tensor.get_shape()), SAFETENSORS_DTYPES.get(tensor.get_dtype(),
                                                                                    tensor.get_dtype()))
            if check is not None:
                check(header, declared)
            tensors = {name: f.get_tensor(name) for name in f.keys()}
    except (SafetensorError, OSError, ValueError, TypeError) as problem:
        if isinstance(problem, error):
            raise
        raise error(f"cannot read {path} as safetensors: {problem}") from None
    return (tensors, header) if metadata else tensors


def read_torch_pickle(path, error=InteropError, advice="save it as safetensors"):
    """{name: torch tensor} of a PyTorch pickle holding a state dict, read with ``weights_only=True``;
    ``advice`` ends the refusals (what to give instead)."""
    try:
        import torch
    except ImportError:
        raise error(f"{path} is a PyTorch pickle, which needs torch to read safely: install torch, or "
                    f"{advice}") from None
    readable_file(path, error=error)
    try:
        tensors = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as problem:  # torch's own refusal of anything but plain tensors, or a broken file
        first = str(problem).strip().splitlines()[0] if str(problem).strip() else type(problem).__name__
        raise error(f"{path} is not plain tensors (read with weights_only=True, running no code from the "
                    f"file: {first}); {advice}") from None
    if not isinstance(tensors, dict):
        raise error(f"{path} holds a {type(tensors).__name__}, not a state dict ({{name: tensor}}); {advice}")
    for name, value in tensors.items():
        if not isinstance(name, str):
            kind = "an integer" if isinstance(name, int) else f"a {type(name).__name__}"
            raise error(f"{path}: key {name!r} is {kind}, not a tensor's name (a string): only a "
                        f"state dict {{name: tensor}} can be read; {advice}")
        if not isinstance(value, torch.Tensor):
            raise error(f"{path}: entry {name!r} is a {type(value).__name__}, not a tensor: only a state dict "
                        f"of tensors can be read (e.g. model.state_dict(), not a training checkpoint); {advice}")
    return tensors


def torch_declared(tensors):
    """{name: (shape, dtype name)} of a state dict read by ``read_torch_pickle``, as a safetensors header
    declares them: what an importer's shape and dtype check sees, whichever file it came from."""
    return {name: (tuple(value.shape), str(value.dtype).replace("torch.", "")) for name, value in tensors.items()}
