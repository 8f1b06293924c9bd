"""Module and Parameter: the containers layers are built from.

A ``Module`` finds its parameters and sub-modules among its attributes (in the
order they were set), as PyTorch's ``nn.Module`` does, and gives every
parameter a dotted name ("encoder.layers.0.self_attn.w_q.weight") used by
``state_dict``. A parameter reachable under several names (tied weights) is
listed once, under the first name.
"""

import contextlib

from ...engine import backend
from ...engine.tensor import Tensor, no_grad

__all__ = ["Parameter", "Module", "ModuleList", "StateDictError", "inference"]


class Parameter(Tensor):
    """A Tensor that is a learnable weight of a Module (always requires grad)."""

    __slots__ = ()
    keeps_compute_copy = True  # amp: products read it through a cached half copy the optimiser refreshes

    def __init__(self, data):
        super().__init__(data, requires_grad=True)

    def __repr__(self):
        return "Parameter" + super().__repr__()[len("Tensor"):]


class StateDictError(KeyError):
    """``load_state_dict`` found missing, unexpected or mis-shaped entries (all are listed).

    ``missing`` and ``unexpected`` hold the keys, ``mismatched`` (key, state shape, model shape)
    triples, in the model's order (``unexpected``: the state's), for callers that summarise.
    """

    def __init__(self, message, missing=(), unexpected=(), mismatched=()):
        super().__init__(message)
        self.missing, self.unexpected, self.mismatched = list(missing), list(unexpected), list(mismatched)

    def __str__(self):
        return self.args[0]


class Module:
    """Base class of layers: parameters, sub-modules, buffers, train/eval mode, devices."""

    def __init__(self):
        object.__setattr__(self, "training", True)
        object.__setattr__(self, "_buffers", {})

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def forward(self, *args, **kwargs):
        raise NotImplementedError

    # ------------------------------------------------------------------ structure
    def _children(self):
        """(name, Parameter | Module) pairs held directly by this module, in order."""
        for name, value in vars(self).items():
            if isinstance(value, (Parameter, Module)):
                yield name, value

    def named_modules(self, prefix=""):
        yield prefix, self
        for name, value in self._children():
            if isinstance(value, Module):
                yield from value.named_modules(f"{prefix}{name}.")

    def modules(self):
        return [m for _, m in self.named_modules()]

    def named_parameters(self):
        """(dotted name, Parameter) for every distinct parameter, depth first."""
        seen = set()
        stack = [("", self)]
        result = []
        while stack:
            prefix, module = stack.pop()
            children = []
            for name, value in module._children():
                if isinstance(value, Parameter):
                    if id(value) not in seen:
                        seen.add(id(value))
                        result.append((prefix + name, value))
                else:
                    children.append((f"{prefix}{name}.", value))
            stack.extend(reversed(children))
        return result

    def parameters(self):
        return [p for _, p in self.named_parameters()]

    def num_parameters(self):
        """How many scalars the distinct parameters hold (tied weights counted once)."""
        return sum(p.size for p in self.parameters())

    def register_buffer(self, name, array):
        """A constant array (not learned, not saved) that follows the module across devices."""
        self._buffers[name] = array
        object.__setattr__(self, name, array)

    # ------------------------------------------------------------------ modes
    def train(self, mode=True):
        """Training mode (dropout active) for this module and every sub-module."""
        for module in self.modules():
            object.__setattr__(module, "training", bool(mode))
        return self

    def eval(self):
        """Evaluation mode: dropout off."""
        return self.train(False)

    def zero_grad(self):
        for p in self.parameters():
            p.grad = None

    # ------------------------------------------------------------------ devices and dtypes
    def to(self, device=None, dtype=None):
        """Move every parameter and buffer to ``device`` and/or cast it to ``dtype``, in place.

        Parameters keep their identity (an optimizer built earlier still holds them);
        their gradients are dropped.
        """
        if device is not None:
            backend.check_device(device)
        if dtype is not None and not backend.is_floating(dtype):
            raise TypeError(f"Module.to: dtype must be floating, got {dtype}")

        def convert(array):
            if device is not None:
                array = backend.to_device(array, device)
            if dtype is not None and backend.is_floating(array.dtype) and array.dtype != dtype:
                array = array.astype(dtype)
            return array

        for p in self.parameters():
            p.data, p.grad = convert(p.data), None
        for module in self.modules():
            for name, array in module._buffers.items():
                module.register_buffer(name, convert(array))
        self._parameters_replaced()
        return self

    def _parameters_replaced(self):
        """Called on every module after ``to`` or ``load_state_dict`` gave parameters new arrays: a
        module that stores parameters together (``MultiHeadAttention`` packs its projections back
        to back) does so again by overriding ``parameters_replaced``."""
        for module in self.modules():
            module.parameters_replaced()

    def parameters_replaced(self):
        """Nothing by default (see ``_parameters_replaced``)."""

    def double(self):
        """Cast to float64 (what gradient checking wants)."""
        import numpy

        return self.to(dtype=numpy.float64)

    # ------------------------------------------------------------------ saving and loading
    def state_dict(self):
        """{dotted name: NumPy copy of the parameter}, distinct parameters only."""
        return {name: backend.to_numpy(p.data).copy() for name, p in self.named_parameters()}

    def load_state_dict(self, state, strict=True):
        """Copy ``state``'s arrays into the parameters, keeping their device and dtype.

        Checks everything before changing anything: with ``strict`` (the default),
        a missing or unexpected key is an error; a shape mismatch always is. The
        error lists every offending key with both shapes.
        """
        own = dict(self.named_parameters())
        missing = [k for k in own if k not in state]
        unexpected = [k for k in state if k not in own]
        mismatched = [
            (k, tuple(getattr(state[k], "shape", ())), tuple(own[k].shape))
            for k in own
            if k in state and tuple(getattr(state[k], "shape", ())) != tuple(own[k].shape)
        ]
        problems = []
        if strict and missing:
            problems.append("missing keys: " + ", ".join(missing))
        if strict and unexpected:
            problems.append("unexpected keys: " + ", ".join(unexpected))
        if mismatched:
            problems.append("shape mismatch: " + "; ".join(f"{k}: checkpoint {saved} vs model {shape}"
                                                         for k, saved, shape in mismatched))
        if problems:
            raise StateDictError(f"load_state_dict into {type(self).__name__}: " + " | ".join(problems),
                                 missing if strict else (), unexpected if strict else (), mismatched)
        for name, p in own.items():
            if name in state:
                value = backend.like(backend.to_numpy(state[name]), p.data)
                p.data = value.astype(p.data.dtype, copy=True)
                p.grad = None
        self._parameters_replaced()
        return self

    # ------------------------------------------------------------------ display
    def extra_repr(self):
        return ""

    def __repr__(self):
        lines = [f"{type(self).__name__}({self.extra_repr()}"]
        children = [(n, m) for n, m in self._children() if isinstance(m, Module)]
        for name, module in children:
            body = repr(module).replace("\n", "\n  ")
            lines.append(f"  ({name}): {body}")
        return "\n".join(lines) + ("\n)" if children else ")")


class ModuleList(Module):
    """An indexable list of sub-modules, named "0", "1", ... in dotted names."""

    def __init__(self, modules=()):
        super().__init__()
        self._items = list(modules)

    def _children(self):
        for i, module in enumerate(self._items):
            yield str(i), module

    def __getitem__(self, index):
        return self._items[index]

    def __len__(self):
        return len(self._items)

    def __iter__(self):
        return iter(self._items)

    def append(self, module):
        self._items.append(module)
        return self


@contextlib.contextmanager
def inference(model):
    """``with nn.inference(model):`` runs ``model`` for inference: eval mode (dropout off) and no graph.

    On leaving, even through an exception, every sub-module gets back the mode it had (a model
    may mix modes) and graph recording is as it was. Decoding and the study tools use it.
    """
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        with no_grad():
            yield model
    finally:
        for module, mode in modes:
            object.__setattr__(module, "training", mode)
