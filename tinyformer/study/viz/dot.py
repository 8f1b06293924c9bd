"""The computation graph behind a Tensor as Graphviz DOT text, and its rendering with ``dot``.

``to_dot`` needs nothing; ``render_dot`` needs Graphviz's ``dot`` program.
"""

import shutil
import subprocess
from pathlib import Path

from ...engine.tensor import Edge, Tensor

__all__ = ["GraphvizMissing", "to_dot", "render_dot", "RENDER_FORMATS"]


class GraphvizMissing(RuntimeError):
    """Graphviz's ``dot`` program is not on the PATH."""


class _Dot:
    """Collects numbered nodes and edges; ``text()`` is the DOT source."""

    def __init__(self):
        self.ids, self.lines, self.edges = {}, [], {}

    def node(self, obj, prefix, label, attributes):
        key = id(obj)
        if key not in self.ids:
            self.ids[key] = f"{prefix}{len(self.ids)}"
            self.lines.append(f'  {self.ids[key]} [label="{_escape(label)}", {attributes}];')
        return self.ids[key]

    def edge(self, tail, head, attributes=""):
        line = f"  {tail} -> {head}" + (f" [{attributes}]" if attributes else "") + ";"
        self.edges.setdefault(line, None)  # an ordered set: each edge once, in the order first drawn

    def text(self):
        header = ["digraph tinyformer {",
                  '  node [fontname="Helvetica", fontsize=10];',
                  '  edge [arrowsize=0.7];']
        return "\n".join(header + self.lines + list(self.edges) + ["}"]) + "\n"


def _escape(label):
    return label.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _shape(array):
    return str(tuple(int(n) for n in array.shape))


def to_dot(tensor, path=None, names=None):
    """The graph that produced ``tensor`` as Graphviz DOT text (also written to ``path`` if given).

    Function nodes (boxes) carry ``Function.name``; tensor nodes (ellipses) their
    shape and dtype; edges run from inputs to outputs. Leaves that require grad are
    blue, named from ``names`` ({name: Tensor}, e.g. ``dict(model.named_parameters())``)
    when given; arrays passed to a Function that are not Tensors (masks, ids) are
    dashed notes. Call it before ``backward()``, which frees the graph (or pass
    ``retain_graph=True`` to backward).
    """
    if not isinstance(tensor, Tensor):
        raise TypeError(f"to_dot: expected a Tensor, got {type(tensor).__name__}")
    labels = {}
    for name, t in (names or {}).items():  # a tensor that is not a leaf requiring grad is its Edge in the graph
        labels[id(t)] = name
        if t._edge is not None:
            labels[id(t._edge)] = name
    dot, expanded, pending = _Dot(), set(), []

    def tensor_node(t, role=None):
        if role is None:
            role = labels.get(id(t)) or ("leaf" if t.requires_grad and t.grad_fn is None else
                                         "constant" if t.grad_fn is None else "")
        label = (role + "\n" if role else "") + f"{_shape(t)} {t.dtype}"
        fill = ("darkolivegreen1" if role == "output" else "lightblue" if t.requires_grad and t.grad_fn is None
                else "white")
        node = dot.node(t, "t", label, f'shape=ellipse, style=filled, fillcolor="{fill}"')
        if t.grad_fn is not None:
            fn = dot.node(t.grad_fn, "f", t.grad_fn.name, 'shape=box, style=filled, fillcolor="lightgrey"')
            dot.edge(fn, node)
            if id(t.grad_fn) not in expanded:
                expanded.add(id(t.grad_fn))
                pending.append(t.grad_fn)
        return node

    tensor_node(tensor, "output")
    while pending:
        fn = pending.pop()
        head = dot.ids[id(fn)]
        if fn.inputs is None:
            raise ValueError(f"to_dot: the graph through {fn.name} was freed by backward(); call to_dot "
                             "before backward, or pass retain_graph=True to backward")
        for x in fn.inputs:  # leaves that require grad, Edges for the rest (autograd keeps no values)
            if isinstance(x, Tensor) or (isinstance(x, Edge) and not x.is_array):
                dot.edge(tensor_node(x), head)
            elif isinstance(x, Edge):
                note = dot.node(x, "c", f"array\n{_shape(x)} {x.dtype}", "shape=note, style=dashed")
                dot.edge(note, head, "style=dashed")
    text = dot.text()
    if path is not None:
        Path(path).write_text(text, encoding="utf-8")
    return text


RENDER_FORMATS = ("svg", "png", "pdf")


def render_dot(dot_text, path):
    """Render DOT text to ``path`` (.svg, .png or .pdf, from its suffix) with Graphviz's ``dot``."""
    path = Path(path)
    fmt = path.suffix.lstrip(".").lower()
    if fmt not in RENDER_FORMATS:
        raise ValueError(f"render_dot: {path}: the file name must end in one of "
                         f"{', '.join('.' + f for f in RENDER_FORMATS)}")
    program = shutil.which("dot")
    if program is None:
        raise GraphvizMissing("render_dot: Graphviz's `dot` program is not installed (apt-get install graphviz, "
                              "brew install graphviz or conda install graphviz); the DOT text from to_dot "
                              "needs nothing and any Graphviz viewer opens it")
    path.parent.mkdir(parents=True, exist_ok=True)
    result = subprocess.run([program, f"-T{fmt}", "-o", str(path)], input=dot_text, text=True,
                            capture_output=True, check=False)
    if result.returncode != 0:
        message = (result.stderr.strip().splitlines() or ["no message"])[0]
        raise RuntimeError(f"render_dot: dot failed on {path}: {message}")
    return path
