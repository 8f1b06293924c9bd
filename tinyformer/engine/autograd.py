"""The backward pass: the recorded Functions walked in reverse topological order, without recursion.

``run_backward`` hands each Function the gradients of its outputs and passes what its
``backward`` returns on to its inputs: gradients of non-leaf tensors are kept per (creator
Function, output index), those of leaves per tensor, and added into each leaf's ``.grad``
(``store_grad``) once complete, after the tensor's hooks. It works on the graph's attributes
alone (``Tensor._ctx``, ``Function.inputs`` ...): an input that is not a leaf requiring grad is an
``Edge`` there (creator, index, shape, dtype), so the walk never needs an intermediate's values;
``tensor.backward`` and ``tensor.grad`` are its entry points.

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


def _target(tensor, fn_grads, owned, leaf_uses):
    """Where a gradient for input ``tensor`` may be added directly (a ``GradTarget``), or None:
    the gradient gathered for it so far where the engine owns it (``owned``: (creator, index) keys);
    else, through a creator that hands its gradient on unchanged but for the dtype
    (``passes_gradient_to_input``: a parameter's compute copy, an autocast cast), the target of that
    creator's input; else the ``.grad`` of a leaf that only this input reaches (``leaf_uses``: a leaf
    used several times, as tied embeddings are, gathers its gradients first and adds their sum, in
    the order it always has). Never where a hook sees the gradient first, nor a leaf whose
    post-accumulate hooks wait for its gradient (they run from ``store_grad``'s path)."""
    while tensor._ctx is not None:
        ctx, index = tensor._ctx, tensor._index
        slots = fn_grads.get(ctx)
        if slots is not None and slots[index] is not None:
            gathered = slots[index]
            return GradTarget(gathered=gathered) if (ctx, index) in owned and gathered.flags.c_contiguous else None
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


def _grad_targets(fn, fn_grads, owned, leaf_uses):
    """A ``GradTarget`` or None for each input of ``fn`` (``_target``)."""
    return tuple(_target(tensor, fn_grads, owned, leaf_uses) if needs else None
                 for tensor, needs in zip(fn.inputs, fn.needs_input_grad))


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


def _sum(a, b):
    """a + b for two gradients of one tensor (a new array; large ones summed on several threads)."""
    return backend.blockwise(backend.get_array_module(a, b).add, a, b)


def run_backward(roots, root_grads, retain_graph, capture=None):
    """Propagate ``root_grads`` from ``roots`` through the graph.

    Gradients arriving at non-leaf tensors are kept per (creator Function, output
    index); those arriving at leaves per tensor. With ``capture`` (tensors), their
    gradients are returned instead of being accumulated into any ``.grad``.
    """
    fn_grads = {}
    leaf_grads = {}
    owned = set()  # (creator, index) of gathered gradients no one else holds: GradTarget may add into them

    def arrive(tensor, g, source, fresh=False):
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
            entry = leaf_grads.get(id(tensor))
            if entry is None:
                leaf_grads[id(tensor)] = [tensor, g]
            else:
                entry[1] = _sum(entry[1], g)
            return
        slots = fn_grads.get(ctx)
        if slots is None:
            slots = fn_grads[ctx] = [None] * (len(ctx._out_meta) if ctx._out_meta else 1)
        i = tensor._index
        if slots[i] is not None:
            g, fresh = _sum(slots[i], g), True
        slots[i] = g
        if fresh:  # a slot is filled once, then only replaced by a sum: no key ever needs removing
            owned.add((ctx, i))

    for root, g in zip(roots, root_grads):
        arrive(root, g, "backward")

    captured = {}
    if capture is not None:
        wanted = {(t._ctx, t._index): t for t in capture if t._ctx is not None}

    order = list(reversed(_topological_order([r._ctx for r in roots if r._ctx is not None])))
    # Leaves with post-accumulate hooks are finished as soon as the last Function feeding them ran.
    leaf_uses, consumers = _leaf_uses(order) if capture is None else ({}, {})

    def finish_leaf(tensor, g):
        if tensor._hooks:
            for hook in list(tensor._hooks):
                replaced = hook(g)
                if replaced is not None:
                    g = _check_hook_result(replaced, g)
        if capture is None:
            store_grad(tensor, g)
            for hook in list(tensor._post_accumulate_hooks or ()):
                hook(tensor)
        else:
            captured[id(tensor)] = g

    def consumed(fn):
        for tensor, needs in zip(fn.inputs, fn.needs_input_grad):
            if needs and id(tensor) in consumers:
                consumers[id(tensor)] -= 1
                if not consumers[id(tensor)] and id(tensor) in leaf_grads:
                    finish_leaf(*leaf_grads.pop(id(tensor)))

    for fn in order:
        grads = fn_grads.pop(fn, None)
        if grads is None:  # no gradient reached this node
            if consumers:
                consumed(fn)
            continue
        if fn._hooks:
            for i, hooks in fn._hooks.items():
                for hook in list(hooks):
                    if grads[i] is not None:
                        replaced = hook(grads[i])
                        if replaced is not None:
                            grads[i] = _check_hook_result(replaced, grads[i])
        if capture is not None:
            for i, g in enumerate(grads):
                if (fn, i) in wanted and g is not None:
                    captured[id(wanted[(fn, i)])] = g
        if fn._out_meta and fn.materialize_grads:
            xp = backend.get_array_module(*[g for g in grads if g is not None])
            grads = [
                xp.zeros(shape, dtype) if g is None else g
                for g, (shape, dtype) in zip(grads, fn._out_meta)
            ]
        fn.retain_graph = retain_graph
        if capture is None and fn.accepts_grad_targets:
            fn.grad_targets = _grad_targets(fn, fn_grads, owned, leaf_uses)
        input_grads = fn.backward(*grads)
        if fn.accepts_grad_targets:
            fn.grad_targets = ()
        if type(input_grads) is not tuple:
            input_grads = (input_grads,)
        for tensor, needs, g in zip(fn.inputs, fn.needs_input_grad, input_grads):
            if needs and g is not None:
                # fresh: a new array of the Function's own, handed to this input alone
                fresh = fn.fresh_input_grads and sum(h is g for h in input_grads) == 1 \
                    and not any(h is g for h in grads)
                arrive(tensor, g, fn.name, fresh)
        if consumers:
            consumed(fn)
        if not retain_graph:
            fn.release()

    for tensor, g in leaf_grads.values():
        finish_leaf(tensor, g)
    return captured


def _check_hook_result(new, old):
    """A hook's replacement gradient (an array: ``Tensor.register_hook`` unwraps a Tensor), checked."""
    if new.shape != old.shape:
        raise RuntimeError(f"a hook returned a gradient of shape {new.shape}, expected {old.shape}")
    return new
