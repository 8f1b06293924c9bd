"""The whole training step as CUDA graphs (``--cuda-graphs on``): captured once per batch shape,
replayed for every later batch of that shape.

A step here is device work only: the batch is copied into static input buffers, the loss
multiplier (fp16's loss scale / the step's target tokens), the learning rate and bias
corrections (``Adam.write_step_scalars``) and the dropout seeds (``random.kernel_seed``'s slots)
are written into small device buffers before the step; inside it the forward and backward passes
accumulate into persistent gradient buffers (zeroed in place), the loss totals into a device
buffer, and ``Adam.step_on_device`` computes the global gradient norm, clips, skips a non-finite
update on the device and updates; after it one read brings the totals, the norm and whether the
update was applied. Nothing in it reads a value back or depends on a Python number that changes.

The first batch of a shape runs this step eagerly on the graph stream (kernels compile and load,
buffers are allocated); the second captures it (``backend.GraphCapture``: one private memory pool
for all graphs) and replays it; later ones replay. Every path runs the same kernels on the same
values, so results do not depend on which one ran. Lengths are padded up to a bucket
(``data.ShapeBuckets``) so that there are few shapes; padding is masked (loss and gradients are
the unpadded batch's).
"""

import contextlib
import warnings

import numpy

from ...engine import amp, backend, kernels
from ...engine import random as tf_random
from ..data.batching import ShapeBuckets
from ...engine.functional import KeyLengthMask
from ...engine.kernels.arguments import DeviceSeed
from ...engine.tensor import Tensor
from .evaluation import batch_loss

__all__ = ["GraphedStep", "graphs_unavailable_reason", "open_capture", "graphed_step"]

#: dropout calls one captured step may hold (a base model has 6 per encoder and 9 per decoder layer, plus 2)
SEED_SLOTS = 4096


def graphs_unavailable_reason(config, comm_size, device_array):
    """Why ``--cuda-graphs on`` cannot be honoured for this run, or None."""
    if config.device != "cuda" or not backend.is_cupy_array(device_array):
        return "CUDA graphs need --device cuda"
    if comm_size > 1:
        return "CUDA graphs run with one process (the ranks' all-reduce is not captured)"
    if not kernels.use_kernels(device_array):
        return "CUDA graphs need tinyformer's kernels (TINYFORMER_KERNELS is off)"
    return None


def open_capture(config, comm_size, device_array):
    """The capture the graphed step of this run records and replays its steps with: a
    ``backend.GraphCapture``. Raises ``backend.CaptureUnavailable`` naming why CUDA graphs cannot
    be used here: a reason of ``graphs_unavailable_reason``, or ``GraphCapture``'s own (no GPU, a
    CuPy that cannot capture).

    The seam through which any other capture reaches training: one with ``GraphCapture``'s
    methods (``begin``, ``end``, ``on_stream``, ``capture``, ``replay``, ``adopt``, ``pool_bytes``,
    ``kernel_nodes``) returned here is the one ``GraphedStep`` uses; if its device memory is not
    CuPy's, it says through ``backend.capturing(memory=...)`` how the ops' NumPy reference outputs
    become that memory. The tests replace this function to test the graph step without a GPU on a
    capture emulated on NumPy arrays (tests/emulated_capture.py; docs/cuda-graphs.md)."""
    reason = graphs_unavailable_reason(config, comm_size, device_array)
    if reason is not None:
        raise backend.CaptureUnavailable(reason)
    return backend.GraphCapture()


def graphed_step(config, comm_size, model, adam, precision, quietly, stacklevel=2):
    """The ``GraphedStep`` of a run's ``config`` with ``cuda_graphs="on"`` (``open_capture``'s), or None
    after one RuntimeWarning naming why not (at ``stacklevel``, counted from the caller)."""
    try:
        capture = open_capture(config, comm_size, next(iter(model.parameters())).data)
    except backend.CaptureUnavailable as reason:
        warnings.warn(f"--cuda-graphs on: {reason}; the steps run eagerly", RuntimeWarning, stacklevel=stacklevel + 1)
        return None
    return GraphedStep(model, adam, precision, config.label_smoothing, config.max_tokens, model.config.max_len,
                       capture, shape_multiple=config.shape_multiple, quietly=quietly)


class _SeedTable:
    """The dropout seeds of captured graphs: during a capture each ``kernel_seed(generator)`` gets
    the next slot; before a replay the slots of that graph are filled with one draw each from their
    generators, in order (the draws the eager step would make)."""

    def __init__(self, memory):
        self.table = memory(numpy.zeros(SEED_SLOTS, dtype=numpy.uint64))
        self.used = 0

    def recorder(self, generators):
        def slot(generator):
            index = self.used + len(generators)
            if index >= SEED_SLOTS:
                raise backend.CaptureUnavailable(f"the step draws more than {SEED_SLOTS} dropout seeds")
            generators.append(generator)
            return DeviceSeed(self.table, index)

        return slot

    def fill(self, first, generators):
        if generators:
            backend.copy_into(self.table[first:first + len(generators)], tf_random.draw_kernel_seeds(generators))


class _StaticBatch:
    """One batch's device buffers at a fixed shape: ids, source lengths and the loss multiplier
    (``memory``: a host array as the capture's device memory, ``GraphedStep.device_memory``)."""

    def __init__(self, shape, memory, id_dtype):
        rows, src_len, tgt_len = shape
        self.src = memory(numpy.zeros((rows, src_len), dtype=id_dtype))
        self.tgt_in = memory(numpy.zeros((rows, tgt_len), dtype=id_dtype))
        self.tgt_out = memory(numpy.zeros((rows, tgt_len), dtype=id_dtype))
        self.src_lengths = memory(numpy.zeros(rows, dtype=numpy.int32))
        self.multiplier = memory(numpy.zeros((), dtype=numpy.float32))

    def load(self, batch, multiplier):
        for target, source in ((self.src, batch.src), (self.tgt_in, batch.tgt_in), (self.tgt_out, batch.tgt_out),
                               (self.src_lengths, batch.src_lengths)):
            backend.copy_into(target, source)
        backend.copy_into(self.multiplier, numpy.float32(multiplier))

    def src_key_mask(self, like=None):
        return KeyLengthMask(self.src_lengths, self.src.shape[1])  # made on the device, inside the step


class _Entry:
    """A shape's buffers, its graph once captured, its dropout seed slots and its launches."""

    def __init__(self, statics):
        self.statics, self.graph, self.warmed = statics, None, False
        self.seed_generators, self.first_seed, self.launches = [], 0, None


def _round_up(value, multiple):
    return -(-value // max(1, multiple)) * max(1, multiple)


def _storage_groups(params):
    """``params`` in groups: those stored in one buffer together, by address, where the first of
    them comes; every other parameter alone, in order."""
    groups, by_root = [], {}
    for p in params:
        root = backend.root_buffer(p.data)
        if root is p.data:
            groups.append([p])
        elif id(root) in by_root:
            by_root[id(root)].append(p)
        else:
            by_root[id(root)] = [p]
            groups.append(by_root[id(root)])
    return [sorted(group, key=lambda p: backend.address(p.data)) for group in groups]


class GraphedStep:
    """The training step of ``Trainer`` with ``cuda_graphs="on"``; ``capture`` is a
    ``backend.GraphCapture`` (or another capture with its methods: ``open_capture``).
    ``run(batches, tokens, grad_scale)`` returns (loss sum, NLL sum, gradient norm, applied)."""

    def __init__(self, model, adam, precision, label_smoothing, max_tokens, max_len, capture, warn=warnings.warn,
                 shape_multiple=8, quietly=contextlib.nullcontext):
        self.model, self.adam, self.precision, self.label_smoothing = model, adam, precision, label_smoothing
        self.params = [p for p in model.parameters() if p.requires_grad]
        for p in self.params:
            p.data = capture.adopt(p.data)
        self.like = self.params[0].data
        self.vocab = (model.src_vocab_size, model.tgt_vocab_size)
        self.buckets = ShapeBuckets(max_tokens, shape_multiple, max_len)
        self.capture, self.warn, self.quietly = capture, warn, quietly
        self.entries = {}
        self.seeds = _SeedTable(self.device_memory)
        self.totals = self.device_memory(numpy.zeros(2, dtype=numpy.float64))
        self.loss_check = self.device_memory(numpy.zeros(1, dtype=numpy.float32))
        self.failed = None  # the reason capture was given up, after its one warning
        self.replays = 0
        self.flat_grad, self.grad_views = None, []  # every gradient as a view of one buffer (_flat_gradients)

    def device_memory(self, host_array):
        """``host_array`` copied to the parameters' device, as the capture's memory (``adopt``)."""
        return self.capture.adopt(backend.like(host_array, self.like))

    @property
    def num_shapes(self):
        """Distinct step shapes met so far (= graphs, once each was met twice)."""
        return len(self.entries)

    @property
    def num_graphs(self):
        return sum(entry.graph is not None for entry in self.entries.values())

    def pool_bytes(self):
        return self.capture.pool_bytes()

    def summary(self):
        """One line: the shapes met, graphs captured, steps replayed, the private pool, and why capture
        was given up, if it was."""
        return (f"CUDA graphs: {self.num_shapes} batch shapes, {self.num_graphs} graphs captured, "
                f"{self.replays} steps replayed, private pool {self.pool_bytes() / 2 ** 20:.1f} MiB"
                + (f"; capture given up: {self.failed}" if self.failed else ""))

    def launch_counts(self):
        """The launches of each captured shape's step, counted by family as the capture recorded them
        (``backend.counting_launches``: the same seams on a GPU and in the CPU's emulated capture)."""
        return {key: entry.launches for key, entry in self.entries.items() if entry.graph is not None}

    def kernel_launches(self):
        """Kernel launches per replayed step, for each captured shape (None where unknown)."""
        return {key: self.capture.kernel_nodes(entry.graph) for key, entry in self.entries.items()
                if entry.graph is not None}

    # ------------------------------------------------------------------ one step
    def run(self, batches, tokens, grad_scale=1.0):
        padded = [self.buckets.pad(batch) for batch in batches]
        for batch in padded:
            self._check_ids(batch)
        key = tuple(batch.shape for batch in padded)
        entry = self.entries.get(key)
        if entry is None:
            entry = self.entries[key] = _Entry([_StaticBatch(batch.shape, self.device_memory, batch.src.dtype)
                                                for batch in padded])
        self._prepare()
        self.capture.begin()
        with self.capture.on_stream(), self.quietly():
            for static, batch in zip(entry.statics, padded):
                static.load(batch, grad_scale / tokens)
            self.adam.write_step_scalars(grad_scale=grad_scale)
            if entry.graph is None and entry.warmed and self.failed is None:
                self._capture(entry)
            if entry.graph is not None:
                self.seeds.fill(entry.first_seed, entry.seed_generators)
                self.capture.replay(entry.graph)
                self.replays += 1
            else:
                self._body(entry.statics)
                entry.warmed = True
            totals = backend.to_numpy(self.totals)
        self.capture.end()
        norm, applied = self.adam.finish_device_step()
        return float(totals[0]), float(totals[1]), norm, applied

    def _body(self, statics):
        """The step's device work: no host read, no changing Python number."""
        if self.flat_grad is not None:
            self.flat_grad.fill(0)  # every gradient at once
        else:
            for p in self.params:
                p.grad.fill(0)
        self.totals.fill(0)
        for static in statics:
            with amp.autocast(self.precision):
                loss, nll = batch_loss(self.model, static, self.label_smoothing, padded_logits=True)
                (loss * Tensor(static.multiplier)).backward()
            self.totals[0:1] += loss.data.astype(numpy.float64)
            self.totals[1:2] += nll.data.astype(numpy.float64)
        self.loss_check[...] = self.totals[0:1]
        self.adam.step_on_device(loss=self.loss_check)

    def _capture(self, entry):
        generators = []
        try:
            with tf_random.recording_kernel_seeds(self.seeds.recorder(generators)), \
                    backend.counting_launches() as launches:
                entry.graph = self.capture.capture(lambda: self._body(entry.statics))
        except backend.CaptureUnavailable as error:
            self.failed = str(error)
            self.warn(f"--cuda-graphs: {error}; the steps run eagerly (same kernels, same results)", RuntimeWarning)
            return
        entry.first_seed, entry.seed_generators, entry.launches = self.seeds.used, generators, launches
        self.seeds.used += len(generators)

    def _prepare(self):
        """Persistent gradient buffers and Adam's device plan, outside any capture; parameters,
        gradients and moments as the capture's memory (``adopt``: as they are on the GPU). New
        pointer tables (a parameter, gradient, moment or compute copy at a new address: the tables
        key on them all) invalidate every graph, which holds those addresses."""
        if not (self.grad_views and all(p.grad is view for p, view in zip(self.params, self.grad_views))):
            self._flat_gradients()
        for p in self.params:
            if p.grad is None:
                p.grad = backend.get_array_module(p.data).zeros_like(p.data)
            p.data, p.grad = self.capture.adopt(p.data), self.capture.adopt(p.grad)
        rebuilt = self.adam.prepare_device_step()
        self.adam.m, self.adam.v = ([None if a is None else self.capture.adopt(a) for a in moments]
                                    for moments in (self.adam.m, self.adam.v))
        if rebuilt:
            for entry in self.entries.values():
                entry.graph, entry.seed_generators = None, []
            self.seeds.used = 0  # no graph holds a slot any more

    #: where each gradient starts in the flat buffer: a multiple of this many bytes (CuPy's allocations' alignment),
    #: or of PACKED_ALIGNMENT inside a group of parameters packed back to back in one buffer
    GRADIENT_ALIGNMENT = 256
    PACKED_ALIGNMENT = 16

    def _flat_gradients(self):
        """Every parameter's gradient as a view of one buffer (``flat_grad``), so that the step zeroes
        them all with one launch instead of one a parameter; the values of gradients already there
        are kept. Parameters packed back to back in one buffer (``backend.pack_back_to_back``: the
        queries', keys' and values' projections) get gradients back to back in the same order, which
        one product writes (``functional.LinearParts``). Parameters of several dtypes keep a buffer
        each (Adam's device step needs one)."""
        dtypes = {p.data.dtype for p in self.params}
        if len(dtypes) != 1:
            self.flat_grad, self.grad_views = None, []
            return
        dtype = dtypes.pop()
        offsets, total = {}, 0
        for group in _storage_groups(self.params):
            total = _round_up(total, self.GRADIENT_ALIGNMENT // dtype.itemsize)
            for p in group:  # back to back, as their parameters are (one product writes them all)
                total = _round_up(total, self.PACKED_ALIGNMENT // dtype.itemsize)
                offsets[id(p)] = total
                total += p.data.size
        self.flat_grad = self.device_memory(numpy.zeros(total, dtype=dtype))
        self.grad_views = []
        for p in self.params:
            offset = offsets[id(p)]
            view = self.flat_grad[offset:offset + p.data.size].reshape(p.data.shape)
            if p.grad is not None:
                view[...] = p.grad
            p.grad = view
            self.grad_views.append(view)

    def _check_ids(self, batch):
        """The id range checks that the captured step leaves out, on the host."""
        for name, ids, vocab in (("src", batch.src, self.vocab[0]), ("tgt_in", batch.tgt_in, self.vocab[1]),
                                 ("tgt_out", batch.tgt_out, self.vocab[1])):
            if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
                raise IndexError(f"batch {name} ids must lie in [0, {vocab}), got values from {int(ids.min())} to "
                                 f"{int(ids.max())}")
        if batch.src_lengths is None:
            raise ValueError("--cuda-graphs: a batch's source padding must trail its sentences")
