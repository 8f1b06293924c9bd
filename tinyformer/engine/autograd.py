"""The backward pass: the recorded Functions walked in reverse topological order, without recursion.

``run_backward`` hands each Function the gradients of its outputs and passes what its
``backward`` returns on to its inputs: gradients of non-leaf tensors are kept per (creator
Function, output index), those of leaves per tensor, and added into each leaf's ``.grad``
(``store_grad``) once complete, after the tensor's hooks. It works on the graph's attributes
alone (``Tensor._ctx``, ``Function.inputs`` ...): an input that is not a leaf requiring grad is an
``Edge`` there (creator, index, shape, dtype), so the walk never needs an intermediate's values;
``tensor.backward`` and ``tensor.grad`` are its entry points.

Its steps, each named: the order (``_topological_order``), the gradients gathered per slot and
whether the engine owns them (``_Gradients``), the hooks (``_run_function_hooks``, the tensors'
in ``_Leaves.finish``), and where each leaf's gradient ends, released once complete (``_Leaves``).

A Function that declares ``accepts_grad_targets`` is handed, before its backward, a ``GradTarget``
for each input whose gradient may go straight into a leaf's ``.grad`` (``grad_targets``): it may add
that gradient into the target's array itself (a product accumulating into the gradient buffer) and
return None for that input, saving the separate add (a launch and a pass over the gradient).
"""

import numpy

from . import backend

__all__ = ["run_backward", "store_grad", "GradTarget"]


def store_grad(tensor, grad):
    """Add ``grad`` into ``tensor.grad``, which owns its buffer (no aliasing of op arrays)."""
    if tensor.grad is None:
        tensor.grad = grad.copy()
    else:
        tensor.grad += grad


class GradTarget:
    """Where a Function's backward may add its gradient for one input itself (``Function.grad_targets``),
    returning None for that input: a leaf's ``.grad``, or the gradient already gathered for an
    intermediate tensor (an array the engine owns, so that adding into it changes nothing else)."""

    __slots__ = ("tensor", "gathered")

    def __init__(self, tensor=None, gathered=None):
        self.tensor, self.gathered = tensor, gathered

    def array(self):
        """The array to add into: the gathered gradient, or the leaf's gradient (zeros of its shape
        and dtype made on first use, owned as ``store_grad``'s)."""
        if self.gathered is not None:
            return self.gathered
        tensor = self.tensor
        if tensor.grad is None:
            tensor.grad = backend.get_array_module(tensor.data).zeros_like(tensor.data)
        return tensor.grad

    def output(self):
        """(array, accumulate): where the gradient goes and whether to add it there. A leaf without a
        gradient gets an empty one that its one writer fills (``accumulate`` False: no zeros written
        first, no add; a leaf target is offered to one input only)."""
        if self.gathered is None and self.tensor.grad is None:
            self.tensor.grad = backend.get_array_module(self.tensor.data).empty_like(self.tensor.data)
            return self.tensor.grad, False
        return self.array(), True


def run_backward(roots, root_grads, retain_graph, capture=None):
    """Propagate ``root_grads`` from ``roots`` through the graph: each Function, in reverse
    topological order, is handed the gradients gathered for its outputs, and what its backward
    returns is gathered for its inputs. With ``capture`` (tensors), their gradients are returned
    instead of being accumulated into any ``.grad``."""
    gradients = _Gradients()
    for root, g in zip(roots, root_grads):
        gradients.arrive(root, g, "backward")
    order = list(reversed(_topological_order([r._ctx for r in roots if r._ctx is not None])))
    leaves = _Leaves(gradients, order, capture)
    for fn in order:
        grads = gradients.take(fn)
        if grads is None:  # no gradient reached this node
            leaves.consumed(fn)
            continue
        _run_function_hooks(fn, grads)
        if leaves.wanted:
            leaves.capture_outputs(fn, grads)
        grads = _materialized(fn, grads)
        fn.retain_graph = retain_graph
        if capture is None and fn.accepts_grad_targets:
            fn.grad_targets = gradients.targets(fn, leaves.uses)
        input_grads = fn.backward(*grads)
        if fn.accepts_grad_targets:
            fn.grad_targets = ()
        gradients.hand_on(fn, grads, input_grads if type(input_grads) is tuple else (input_grads,))
        leaves.consumed(fn)
        if not retain_graph:
            fn.release()
    return leaves.finish_all()


def _run_function_hooks(fn, grads):
    """The hooks registered on ``fn``'s outputs, each free to replace its gradient (in ``grads``)."""
    if fn._hooks:
        for i, hooks in fn._hooks.items():
            if grads[i] is not None:
                grads[i] = _through_hooks(hooks, grads[i])


def _through_hooks(hooks, g):
    """``g`` handed to each of ``hooks`` in turn, each free to replace it (checked)."""
    for hook in list(hooks):
        replaced = hook(g)
        if replaced is not None:
            g = _check_hook_result(replaced, g)
    return g


def _materialized(fn, grads):
    """``grads`` with zeros for the outputs no gradient reached, where ``fn`` asks for them
    (``materialize_grads``) and has several outputs."""
    if not (fn._out_meta and fn.materialize_grads):
        return grads
    xp = backend.get_array_module(*[g for g in grads if g is not None])
    return [xp.zeros(shape, dtype) if g is None else g for g, (shape, dtype) in zip(grads, fn._out_meta)]


def _check_hook_result(new, old):
    """A hook's replacement gradient (an array: ``Tensor.register_hook`` unwraps a Tensor), checked."""
    if new.shape != old.shape:
        raise RuntimeError(f"a hook returned a gradient of shape {new.shape}, expected {old.shape}")
    return new


class _Gradients:
    """The gradients gathered so far in one backward pass: a slot per (creator Function, output
    index) for the outputs of Functions, one per leaf tensor for the leaves; and which slots the
    engine ``owned`` (a sum or a cast it made, no one else's array), where a ``GradTarget`` may add."""

    def __init__(self):
        self.slots = {}    # Function -> [gradient of each output, or None]
        self.leaves = {}   # id(leaf) -> [leaf, gradient]
        self.owned = set()  # (creator, index) of gathered gradients no one else holds

    def arrive(self, tensor, g, source, fresh=False):
        """Gather ``g``, the gradient that ``source`` (a Function's name) hands to ``tensor``: checked
        against its shape, cast to its dtype, added to what arrived before. ``fresh``: ``g`` is a new
        array handed to this input alone, which the engine may then add into."""
        if g.shape != tensor.shape:
            raise RuntimeError(
                f"{source}.backward returned a gradient of shape {g.shape} "
                f"for an input of shape {tensor.shape}"
            )
        if g.dtype != tensor.dtype:
            # A float32 gradient too large for a float16 tensor becomes inf, as on a GPU: what the loss
            # scaler looks for (a skipped step), not a numerical accident to warn about.
            with numpy.errstate(over="ignore"):
                g = g.astype(tensor.dtype)
            fresh = True
        ctx = tensor._ctx
        if ctx is None:
            entry = self.leaves.get(id(tensor))
            if entry is None:
                self.leaves[id(tensor)] = [tensor, g]
            else:
                entry[1] = _sum(entry[1], g)
            return
        slots = self.slots.get(ctx)
        if slots is None:
            slots = self.slots[ctx] = [None] * (len(ctx._out_meta) if ctx._out_meta else 1)
        i = tensor._index
        if slots[i] is not None:
            g, fresh = _sum(slots[i], g), True
        slots[i] = g
        if fresh:  # a slot is filled once, then only replaced by a sum: no key ever needs removing
            self.owned.add((ctx, i))

    def take(self, fn):
        """The gradients of ``fn``'s outputs (None where none arrived), or None if none reached it."""
        return self.slots.pop(fn, None)

    def hand_on(self, fn, grads, input_grads):
        """Gather what ``fn.backward(*grads)`` returned for each input that needs a gradient."""
        for tensor, needs, g in zip(fn.inputs, fn.needs_input_grad, input_grads):
            if needs and g is not None:
                # fresh: a new array of the Function's own, handed to this input alone
                fresh = fn.fresh_input_grads and sum(h is g for h in input_grads) == 1 \
                    and not any(h is g for h in grads)
                self.arrive(tensor, g, fn.name, fresh)

    def targets(self, fn, leaf_uses):
        """A ``GradTarget`` or None for each input of ``fn`` (``target``)."""
        return tuple(self.target(tensor, leaf_uses) if needs else None
                     for tensor, needs in zip(fn.inputs, fn.needs_input_grad))

    def target(self, tensor, leaf_uses):
        """Where a gradient for input ``tensor`` may be added directly (a ``GradTarget``), or None:
        the gradient gathered for it so far where the engine owns it; else, through a creator that
        hands its gradient on unchanged but for the dtype (``passes_gradient_to_input``: a
        parameter's compute copy, an autocast cast), the target of that creator's input; else the
        ``.grad`` of a leaf that only this input reaches (``leaf_uses``: a leaf used several times, as
        tied embeddings are, gathers its gradients first and adds their sum, in the order it always
        has). Never where a hook sees the gradient first, nor a leaf whose post-accumulate hooks wait
        for its gradient (they run from ``store_grad``'s path)."""
        while tensor._ctx is not None:
            ctx, index = tensor._ctx, tensor._index
            slots = self.slots.get(ctx)
            if slots is not None and slots[index] is not None:
                gathered = slots[index]
                return GradTarget(gathered=gathered) if (ctx, index) in self.owned and gathered.flags.c_contiguous \
                    else None
            if not getattr(ctx, "passes_gradient_to_input", False) or ctx._hooks or not ctx.inputs \
                    or not ctx.needs_input_grad[0]:
                return None
            tensor = ctx.inputs[0]
        if tensor._hooks or tensor._post_accumulate_hooks or leaf_uses.get(id(tensor)) != 1:
            return None
        grad = tensor.grad
        if grad is not None and (grad.shape != tensor.data.shape or grad.dtype != tensor.data.dtype):
            return None
        return GradTarget(tensor)


class _Leaves:
    """Where a pass's gradients end: each leaf's gradient, once complete, through the tensor's hooks
    into its ``.grad`` (``store_grad``), then its post-accumulate hooks; or, with ``capture``
    (tensors), the captured gradients returned instead, no ``.grad`` touched.

    A leaf with post-accumulate hooks is finished as soon as the last Function feeding it ran
    (``uses``, counted over ``order``); the others when the walk ends."""

    def __init__(self, gradients, order, capture):
        self.gradients, self.capture, self.captured = gradients, capture, {}
        self.wanted = {} if capture is None else {(t._ctx, t._index): t for t in capture if t._ctx is not None}
        self.uses, self.waiting = _leaf_uses(order) if capture is None else ({}, {})

    def capture_outputs(self, fn, grads):
        """With ``capture``: keep the gradients of ``fn``'s outputs that were asked for."""
        for i, g in enumerate(grads):
            if (fn, i) in self.wanted and g is not None:
                self.captured[id(self.wanted[(fn, i)])] = g

    def consumed(self, fn):
        """``fn`` ran (or no gradient reached it): a waiting leaf it was the last to feed is finished."""
        if not self.waiting:
            return
        for tensor, needs in zip(fn.inputs, fn.needs_input_grad):
            if needs and id(tensor) in self.waiting:
                self.waiting[id(tensor)] -= 1
                if not self.waiting[id(tensor)] and id(tensor) in self.gradients.leaves:
                    self.finish(*self.gradients.leaves.pop(id(tensor)))

    def finish(self, tensor, g):
        if tensor._hooks:
            g = _through_hooks(tensor._hooks, g)
        if self.capture is None:
            store_grad(tensor, g)
            for hook in list(tensor._post_accumulate_hooks or ()):
                hook(tensor)
        else:
            self.captured[id(tensor)] = g

    def finish_all(self):
        """The walk is over: finish every leaf still gathered; returns the captured gradients."""
        for tensor, g in self.gradients.leaves.values():
            self.finish(tensor, g)
        return self.captured


def _topological_order(roots):
    """Functions reachable from ``roots``, each after every Function feeding it.

    Iterative depth-first search, so a chain of any length needs no recursion (the test's is 20
    times the default recursion limit).
    """
    order, seen = [], set()
    for root in roots:
        if root in seen:
            continue
        seen.add(root)
        stack = [(root, iter(_inputs_of(root)))]
        while stack:
            fn, pending = stack[-1]
            for tensor in pending:
                child = getattr(tensor, "_ctx", None)  # inputs may be Python scalars
                if child is not None and child not in seen:
                    seen.add(child)
                    stack.append((child, iter(_inputs_of(child))))
                    break
            else:
                stack.pop()
                order.append(fn)
    return order


def _inputs_of(fn):
    if fn.inputs is None:
        raise RuntimeError(
            f"backward through {fn.name} whose graph was already freed: a graph can be "
            "traversed once unless the first backward passes retain_graph=True"
        )
    return fn.inputs


def _leaf_uses(order):
    """({id(leaf): how many inputs of the Functions in ``order`` it is}, the same for the leaves that
    have post-accumulate hooks: their gradient is complete once that many inputs have been seen)."""
    uses, pending = {}, {}
    for fn in order:
        for tensor, needs in zip(fn.inputs, fn.needs_input_grad):
            if needs and tensor._ctx is None:
                uses[id(tensor)] = uses.get(id(tensor), 0) + 1
                if tensor._post_accumulate_hooks:
                    pending[id(tensor)] = uses[id(tensor)]
    return uses, pending


def _sum(a, b):
    """a + b for two gradients of one tensor (a new array; large ones summed on several threads)."""
    return backend.blockwise(backend.get_array_module(a, b).add, a, b)
