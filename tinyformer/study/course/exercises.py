"""The course: eight exercises in order, and the files ``tinyformer study start`` writes.

An exercise is one Python file, kept here as a template (``templates/NN_name.py``): the forward
pass in NumPy, given, and ``backward`` for the reader to write (it raises NotImplementedError until
then), with the maths to derive in the docstrings; exercise 7 has the reader write the tiled
``forward`` (FlashAttention's online softmax) and 8 its tiled ``backward``, checked by
``flash_check``. The module-level constant ``EXERCISE = N`` says
which exercise a file holds; the checker reads it. The template's own ``forward`` is the one the
checker differentiates numerically, whatever the reader's copy has become.
"""

import dataclasses
import functools
import importlib.resources
import types
from pathlib import Path

from ...common.atomic import write_atomically

__all__ = ["Exercise", "EXERCISES", "exercise", "template_module", "write_exercise"]


@dataclasses.dataclass(frozen=True)
class Exercise:
    """One exercise: its place in the course, what it is about and what ``backward`` returns.

    ``gradients`` are the names the checker reports, in the order ``backward`` (7: ``forward``)
    returns them;
    ``keys`` are the names of a dict ``backward`` returns instead (exercise 6), in the same order.
    ``reference`` names tinyformer's op whose gradients are the right answer; ``model_op`` the op
    the reader's backward replaces while a model trains (None: there is none).
    """

    number: int
    name: str
    title: str
    summary: str
    gradients: tuple
    reference: str
    keys: tuple = None
    model_op: str = None
    writes: str = "backward"  # the function the reader writes (7: forward)

    @property
    def filename(self):
        return f"{self.number:02d}_{self.name}.py"

    def template(self):
        """The text of the file ``start`` writes."""
        return importlib.resources.files(__package__).joinpath("templates", self.filename).read_text(encoding="utf-8")


_MHA_KEYS = ("query", "key", "value", "w_q", "b_q", "w_k", "b_k", "w_v", "b_v", "w_o", "b_o")

EXERCISES = (
    Exercise(1, "chain_rule", "chain rule", "the chain rule on a small graph: a matmul, tanh, a product and a sum, "
             "with an input used twice", ("dx", "dW", "db"), "tinyformer's Tensor ops (autograd)"),
    Exercise(2, "softmax", "softmax", "softmax along the last axis", ("dx",), "F.softmax",
             model_op="the softmax inside every MultiHeadAttention's attention backward (nn.probe)"),
    Exercise(3, "layer_norm", "layer norm", "layer norm with gain and bias: dx, dgain, dbias", ("dx", "dgain", "dbias"),
             "F.layer_norm", model_op="LayerNorm.backward_reference"),
    Exercise(4, "attention", "attention", "scaled dot-product attention with padding and causal masks: dQ, dK, dV",
             ("dQ", "dK", "dV"), "F.scaled_dot_product_attention",
             model_op="every MultiHeadAttention's attention backward (nn.probe)"),
    Exercise(5, "cross_entropy", "cross entropy",
             "label-smoothed cross entropy over padded targets, as F.cross_entropy",
             ("dlogits",), "F.cross_entropy", model_op="CrossEntropy.backward_reference"),
    Exercise(6, "multi_head_attention", "multi-head attention",
             "multi-head attention with its projections, as nn.MultiHeadAttention",
             ("dquery", "dkey", "dvalue", "dW_Q", "db_Q", "dW_K", "db_K", "dW_V", "db_V", "dW_O", "db_O"),
             "nn.MultiHeadAttention", keys=_MHA_KEYS,
             model_op="nn.MultiHeadAttention (one node: your forward and backward)"),
    Exercise(7, "flash_forward", "FlashAttention forward",
             "the tiled forward: online softmax over key tiles, O and the log-sum-exp, never S whole",
             ("O", "lse"), "the float64 formula (S and P whole) and F.scaled_dot_product_attention",
             model_op="every MultiHeadAttention's attention forward (your O; P recomputed from your lse for backward)",
             writes="forward"),
    Exercise(8, "flash_backward", "FlashAttention backward",
             "the tiled backward: dQ, dK, dV from the saved log-sum-exp, D = rowsum(dO ∘ O), tile by tile",
             ("dQ", "dK", "dV"), "F.scaled_dot_product_attention",
             model_op="every MultiHeadAttention's attention backward (your tiles, from its O and lse)"),
)


def exercise(number):
    """The exercise numbered ``number`` (1 to 8); a ValueError names the valid numbers otherwise."""
    if isinstance(number, bool) or not isinstance(number, int) or not 1 <= number <= len(EXERCISES):
        raise ValueError(f"there is no exercise {number!r}: the exercises are numbered 1 to {len(EXERCISES)} "
                         "(tinyformer study lists them)")
    return EXERCISES[number - 1]


@functools.lru_cache(maxsize=None)
def template_module(number):
    """The template of exercise ``number`` as a module: its given forward, the checker's reference."""
    item = exercise(number)
    module = types.ModuleType(f"tinyformer_study_template_{number:02d}")
    module.__file__ = item.filename
    exec(compile(item.template(), item.filename, "exec"), module.__dict__)
    return module


def write_exercise(number, directory="."):
    """Write exercise ``number`` into ``directory`` (made if missing) as NN_name.py, atomically;
    an existing file is never overwritten (FileExistsError naming it). Returns the path."""
    item = exercise(number)
    folder = Path(directory)
    path = folder / item.filename
    if path.exists() or path.is_symlink():
        raise FileExistsError(f"{path} exists already: not overwritten (check it with `tinyformer study check "
                              f"{path}`, or start in another directory)")
    folder.mkdir(parents=True, exist_ok=True)
    write_atomically(path, item.template().encode("utf-8"))
    return path
