"""Weight files of other frameworks read safely, for every importer (Marian folders, PyTorch state dicts).

``.safetensors`` is read with the ``safetensors`` package (no torch needed); a PyTorch pickle
(``.bin``, ``.pt``, ``.pth``) only with ``torch.load(weights_only=True)``, which runs no code from
the file: a pickle of anything but plain tensors is refused. Each failure is an ``InteropError``
(a ValueError; each importer has its own subclass) of one line naming the file, or the tensor.
"""

import json

import numpy

__all__ = ["InteropError", "float_array", "read_json", "read_safetensors", "read_torch_pickle"]


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
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as problem:
        raise error(f"{path} is not readable JSON ({problem})") from None


def read_safetensors(path, error=InteropError):
    """{name: NumPy array} of a .safetensors file."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="np") as f:
            return {name: f.get_tensor(name) for name in f.keys()}
    except (SafetensorError, OSError, ValueError, TypeError) as problem:
        raise error(f"cannot read {path} as safetensors: {problem}") from None


def read_torch_pickle(path, error=InteropError, advice="save it as safetensors"):
    """{name: torch tensor} of a PyTorch pickle holding a state dict, read with ``weights_only=True``;
    ``advice`` ends the refusals (what to give instead)."""
    try:
        import torch
    except ImportError:
        raise error(f"{path} is a PyTorch pickle, which needs torch to read safely: install torch, or "
                    f"{advice}") from None
    try:
        tensors = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as problem:  # torch's own refusal of anything but plain tensors, or a broken file
        first = str(problem).strip().splitlines()[0] if str(problem).strip() else type(problem).__name__
        raise error(f"{path} is not plain tensors (read with weights_only=True, running no code from the "
                    f"file: {first}); {advice}") from None
    if not isinstance(tensors, dict):
        raise error(f"{path} holds a {type(tensors).__name__}, not a state dict ({{name: tensor}}); {advice}")
    for name, value in tensors.items():
        if not isinstance(name, str) or not isinstance(value, torch.Tensor):
            raise error(f"{path}: entry {name!r} is a {type(value).__name__}, not a tensor: only a state dict "
                        f"of tensors can be read (e.g. model.state_dict(), not a training checkpoint); {advice}")
    return tensors
