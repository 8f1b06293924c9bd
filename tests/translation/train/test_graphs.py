"""--cuda-graphs: the graph step's logic on NumPy arrays (``emulated_capture.EmulatedCapture``
stands in for the CUDA capture: a replay runs the captured step again), the fallback, the seed slots (the tests
with dropout run the step through the emulated CUDA kernels: ``emulated_kernels``), the bounded
shapes, --patience and --time-limit; and on a GPU (``devices.needs_gpu``, at the end), 100 steps
with graphs against 100 eager steps, bit for bit."""

import contextlib
import json
import operator
import shutil
import warnings

import numpy as np
import pytest

from tinyformer import Tensor
from tinyformer.engine import backend
from tinyformer.engine import functional as F
from tinyformer.translation import checkpoint, train
from tinyformer.translation.data.batching import ShapeBuckets
from tinyformer.engine import random as tf_random
from tinyformer.engine.kernels import cublas
from tinyformer.engine.kernels.arguments import DeviceSeed
from tinyformer.translation.train import TrainConfig, Trainer, graphs
from tinyformer.translation.train.builders import build_tokenizer
from tinyformer.translation.train import clock as clock_module

import devices
from emulated_capture import DeviceArray, EmulatedCapture, installed
from tests.translation.train.test_trainer import (QUIET, SMALL_CORPUS, cached_corpus, cached_load_corpus, corpus_cut_to, losses,  # noqa: F401
                        poison, records, six_steps, small_config, small_load_corpus)  # (fixtures)

# The graph tests train on the whole training split (the batch shapes they count and the rounding
# they bound are those of its batches) and validate on test_train's few pairs.
few_validation_pairs = corpus_cut_to({"val": SMALL_CORPUS["val"]})


@pytest.fixture(autouse=True)
def graph_tests_corpus(cached_corpus, monkeypatch):
    """``few_validation_pairs`` (after ``cached_corpus``, which it replaces)."""
    monkeypatch.setattr(train.builders, "load_corpus", few_validation_pairs)


class CountingCapture(EmulatedCapture):
    def __init__(self, fail=None):
        self.captured = self.replayed = 0
        self.fail = fail

    def capture(self, fn):
        if self.fail:
            raise backend.CaptureUnavailable(self.fail)
        self.captured += 1
        return super().capture(fn)

    def replay(self, graph):
        self.replayed += 1
        super().replay(graph)


# The graphed step (``GraphedStep.run``: warm-up, capture, replay and the eager fallback) on the
# GPU's kernel path: the fused ops and Adam run their CUDA kernels through the CPU emulation, the
# dropout kernels reading their seeds from the seed slots at each launch. Validation and decoding
# keep the NumPy reference (through the emulation they would take most of the test).
GRAPHED_STEP = (graphs.GraphedStep, "run")
graphed_step_on_emulated_kernels = pytest.mark.parametrize("emulated_kernels", [GRAPHED_STEP], indirect=True,
                                                           ids=["graphed-step"])


def graph_config(save_dir, **overrides):
    values = dict(cuda_graphs="on", max_steps=12, dropout=0.0)
    values.update(overrides)
    return small_config(save_dir, **values)


def run(config, capture=None, resume=False):
    """A trainer of ``config`` run, on ``capture`` (installed) if one is given."""
    with installed(capture) if capture is not None else contextlib.nullcontext():
        trainer = Trainer(config, resume=resume, **QUIET)
        trainer.run()
    return trainer


def set_up(config, capture):
    """A trainer of ``config`` set up on ``capture`` (installed while it builds its graphed step)."""
    with installed(capture):
        trainer = Trainer(config, **QUIET)
        trainer.setup()
    return trainer


EMULATED = {"dropout": 0.1, "max_tokens": 64, "save_every": 6}  # small batches: the emulated kernels are slow


@pytest.fixture(scope="module")
def graphed_through_the_kernels(tmp_path_factory):
    """(run directory, trainer) of ``graph_config(**EMULATED)`` captured and replayed through the
    emulated kernels: the uninterrupted run of the resume test and the captured run the failed
    capture is compared with, which each ran it."""
    directory = tmp_path_factory.mktemp("graphed") / "run"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(train.builders, "load_corpus", few_validation_pairs)
        devices.take_the_kernel_path(patch, GRAPHED_STEP)
        trainer = run(graph_config(directory, **EMULATED), CountingCapture())
    return directory, trainer


def test_on_the_cpu_the_option_warns_once_and_trains_eagerly(tmp_path, six_steps, monkeypatch):
    """The eager run is test_train's shared ``small_config()`` run (on its small corpus)."""
    monkeypatch.setattr(train.builders, "load_corpus", small_load_corpus)
    eager, _, _ = checkpoint.load_checkpoint(checkpoint.checkpoint_path(six_steps, 6))
    with pytest.warns(RuntimeWarning, match=r"--cuda-graphs on: CUDA graphs need --device cuda; the steps run "
                                             r"eagerly") as caught:
        fallback = run(small_config(tmp_path / "on", cuda_graphs="on"))
    assert len([w for w in caught if "--cuda-graphs" in str(w.message)]) == 1
    assert fallback.graphs is None
    assert losses(tmp_path / "on") == losses(six_steps)
    parameters = dict(fallback.model.named_parameters())
    assert parameters.keys() == eager.keys()
    for name, value in eager.items():
        np.testing.assert_array_equal(value, parameters[name].data, err_msg=name)


def test_replayed_steps_train_as_the_eager_steps(tmp_path):
    """Padding to the bucket shapes changes the sums' order only: the losses agree to rounding, and
    so do the parameters. Adam's step of an element is lr·m̂/(√v̂ + ε): a gradient rounded by a
    relative δ moves it by about lr·δ, so after 12 steps the parameters agree to far below one
    step's lr (measured: 0.006·lr), while one step more or less moves most elements by 0.1–1·lr.
    The key projection's bias is the exception: its gradient is exactly 0 in exact arithmetic
    (softmax ignores a constant added to every key), so Adam turns its rounding noise into steps of lr."""
    capture = CountingCapture()
    graphed = run(graph_config(tmp_path / "graphs"), capture)
    eager = run(graph_config(tmp_path / "eager", cuda_graphs="off"))
    np.testing.assert_allclose(losses(tmp_path / "graphs"), losses(tmp_path / "eager"), rtol=2e-5)
    smallest_step = min(graphed.adam.current_lr(t) for t in range(1, 13))
    for (name, a), (_, b) in zip(graphed.model.named_parameters(), eager.model.named_parameters()):
        if not name.endswith("w_k.bias"):
            np.testing.assert_allclose(a.data, b.data, rtol=0, atol=0.05 * smallest_step, err_msg=name)
    g = graphed.graphs
    assert capture.captured == g.num_graphs >= 1 and capture.replayed == g.replays >= 1
    assert g.num_shapes + g.replays == 12  # each step is a shape's warm-up or a replay (a capture replays too)
    assert graphed.adam.step_count == eager.adam.step_count == 12


def test_the_shapes_are_few_and_logged(tmp_path):
    trainer = run(graph_config(tmp_path, max_steps=30, log_every=5), CountingCapture())
    g = trainer.graphs
    lengths = {length for shape in g.entries for _, src_len, tgt_len in shape for length in (src_len, tgt_len)}
    assert all(length % 8 == 0 or length == trainer.model.config.max_len for length in lengths)
    assert 1 <= g.num_shapes <= len(lengths) ** 2
    logged = [r for r in records(tmp_path) if "graph_shapes" in r]
    assert logged and logged[-1]["graph_shapes"] == g.num_shapes and logged[-1]["graphs"] == g.num_graphs


@graphed_step_on_emulated_kernels
def test_resume_with_graphs_continues_exactly(tmp_path, graphed_through_the_kernels, emulated_kernels):
    """Through the kernels: the replays' dropout masks come from the seed slots."""
    straight, graphed = graphed_through_the_kernels
    assert graphed.graphs.seeds.used > 0  # the kernels took seeds
    interrupted = tmp_path / "interrupted"
    run(graph_config(interrupted, **dict(EMULATED, max_steps=6)), CountingCapture())
    run(graph_config(interrupted, **EMULATED), CountingCapture(), resume=True)
    assert losses(interrupted) == losses(straight)
    a, _, _ = checkpoint.load_checkpoint(checkpoint.checkpoint_path(straight, 12))
    b, _, _ = checkpoint.load_checkpoint(checkpoint.checkpoint_path(interrupted, 12))
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])


@graphed_step_on_emulated_kernels
def test_a_failed_capture_warns_once_and_changes_no_result(tmp_path, graphed_through_the_kernels, emulated_kernels):
    """With dropout, through the kernels: the replays' dropout kernels read their seeds from the
    slots filled before each replay, the eager steps' get the seeds they draw; the same draws, so
    the same bits."""
    graphed_dir, graphed = graphed_through_the_kernels
    with pytest.warns(RuntimeWarning, match="--cuda-graphs: an op synchronised; the steps run eagerly") as caught:
        fallback = run(graph_config(tmp_path / "failed", **EMULATED), CountingCapture(fail="an op synchronised"))
    assert len([w for w in caught if "--cuda-graphs" in str(w.message)]) == 1
    assert fallback.graphs.failed == "an op synchronised" and fallback.graphs.num_graphs == 0
    assert graphed.graphs.replays >= 6 and graphed.graphs.seeds.used > 0
    assert losses(tmp_path / "failed") == losses(graphed_dir)
    for a, b in zip(graphed.model.parameters(), fallback.model.parameters()):
        np.testing.assert_array_equal(a.data, b.data)


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning", "ignore:overflow:RuntimeWarning")
@pytest.mark.parametrize("where, value", [("loss", np.nan), ("gradient", np.inf)])
def test_a_non_finite_update_is_skipped_on_the_device(tmp_path, monkeypatch, where, value):
    trainer = set_up(graph_config(tmp_path), CountingCapture())
    batches = trainer.train_data.batches(256, seed=0, epoch=0)
    for batch in batches[:2]:  # a warm-up and a capture of this shape first
        trainer.train_step([batch])
    assert trainer.step == 2
    before = [p.data.copy() for p in trainer.model.parameters()]
    moments = [m.copy() for m in trainer.adam.m]
    poison(monkeypatch, lambda n: True, where, value, trainer)
    result = trainer.train_step(batches[:1])
    loss, grad_norm = result.loss, result.grad_norm
    assert not result.applied and not result.overflowed
    if where == "loss":
        assert not np.isfinite(loss) and grad_norm is None
    else:
        assert np.isfinite(loss) and not np.isfinite(grad_norm)
    assert trainer.step == 2 and trainer.adam.step_count == 2 and trainer.batch_in_epoch == 3
    for p, b in zip(trainer.model.parameters(), before):
        np.testing.assert_array_equal(p.data, b)
    for m, b in zip(trainer.adam.m, moments):
        np.testing.assert_array_equal(m, b)


def test_the_seed_slots_replay_the_eager_draws():
    """Captured dropout calls take slots; filling them draws what the eager calls would have drawn."""
    own = np.random.default_rng(7)
    tf_random.manual_seed(3)
    eager = [tf_random.kernel_seed(None), tf_random.kernel_seed(own), tf_random.kernel_seed(None)]
    own = np.random.default_rng(7)
    tf_random.manual_seed(3)
    table, generators = graphs._SeedTable(lambda host: host), []
    before = (tf_random.get_rng_state(), own.bit_generator.state)
    with tf_random.recording_kernel_seeds(table.recorder(generators)):
        slots = [tf_random.kernel_seed(None), tf_random.kernel_seed(own), tf_random.kernel_seed(None)]
    assert [s.index for s in slots] == [0, 1, 2] and generators == [None, own, None]
    assert (tf_random.get_rng_state(), own.bit_generator.state) == before  # recording drew nothing
    tf_random.manual_seed(3)  # replaces the default generator: the slots look it up again
    table.fill(0, generators)
    assert table.table[:3].tolist() == eager


def test_patience_stops_after_validations_without_a_better_bleu(tmp_path, monkeypatch):
    scores = iter([5.0, 7.0, 6.0, 7.0, 9.0])
    monkeypatch.setattr(Trainer, "validate", lambda self: {"bleu_greedy": next(scores)})
    trainer = run(small_config(tmp_path, max_steps=50, eval_every=2, patience=2, save_every=100))
    assert trainer.step == 8  # 7.0 at step 4 is the best; 6.0 and 7.0 (not better) at 6 and 8
    assert checkpoint.list_checkpoints(tmp_path)[-1] == checkpoint.checkpoint_path(tmp_path, 8)


def test_time_limit_stops_saves_and_validates(tmp_path, monkeypatch):
    clock = iter(range(0, 10_000, 50))  # the trainer's clock: each reading 50 s after the last

    class Clock:
        monotonic = staticmethod(lambda: float(next(clock)))

    monkeypatch.setattr(clock_module, "time", Clock)
    validated = []
    monkeypatch.setattr(Trainer, "validate", lambda self: validated.append(self.step) or {"bleu_greedy": 1.0})
    trainer = run(small_config(tmp_path, max_steps=50, eval_every=100, save_every=100, time_limit=2.0))
    assert trainer.step == 3 and validated == [3]  # deadline 120 s; the steps end at 50, 100 and 150 s
    assert checkpoint.list_checkpoints(tmp_path) == [checkpoint.checkpoint_path(tmp_path, 3)]


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_steps_replay_without_a_read_back(tmp_path, precision):
    """The emulated replay runs under ``backend.capturing()``: a read-back in the step would raise."""
    graphed = run(graph_config(tmp_path / "graphs", precision=precision, max_steps=6), CountingCapture())
    eager = run(graph_config(tmp_path / "eager", precision=precision, max_steps=6, cuda_graphs="off"))
    assert graphed.graphs.replays >= 1
    # padding reorders half-precision sums: bf16 keeps 8 bits of mantissa (3e-3 per rounding)
    np.testing.assert_allclose(losses(tmp_path / "graphs"), losses(tmp_path / "eager"), rtol=1e-2)
    if precision == "fp16":
        assert graphed.scaler.scale == eager.scaler.scale


def test_host_reads_and_copies_are_refused_while_capturing():
    x = np.ones(3, dtype=np.float32)
    with backend.capturing():
        for call in (lambda: backend.to_numpy(x), lambda: Tensor(x[:1]).item(),
                     lambda: backend.copy_into(x, np.zeros(3)), lambda: backend.to_device([1.0], "cuda")):
            with pytest.raises(backend.CaptureUnavailable, match="inside a captured step"):
                call()
    assert backend.to_numpy(x) is not None and not backend.is_capturing()


HOST_READS = {"float": float, "int": int, "bool": bool, "operator.index": operator.index,
              "item": lambda a: a.item(), "tolist": lambda a: a.tolist(), "Tensor bool": lambda a: bool(Tensor(a))}


def test_emulated_device_arrays_refuse_what_cupy_refuses_while_capturing():
    """CuPy's ``@`` (cuBLAS, which CuPy will not call during a capture) and boolean-mask indexing (a
    count read to the host) are refused inside a capture; kernels.cublas.matmul and copyto are not."""
    x = EmulatedCapture.adopt(np.arange(6, dtype=np.float32).reshape(2, 3))
    with backend.capturing():
        with pytest.raises(NotImplementedError, match="cuBLAS API during stream capture"):
            x @ x.T
        with pytest.raises(backend.CaptureUnavailable, match="boolean mask"):
            x[x > 2] = 0
        with pytest.raises(backend.CaptureUnavailable, match="boolean mask"):
            x[x > 2]
        product = cublas.matmul(x, x.T)
        np.copyto(x, 0, where=x > 2)
    np.testing.assert_array_equal(product, np.arange(6).reshape(2, 3) @ np.arange(6).reshape(2, 3).T)
    np.testing.assert_array_equal(x, [[0, 1, 2], [0, 0, 0]])
    assert type(product) is DeviceArray and (x @ x.T).shape == (2, 2)  # outside a capture: allowed


def test_the_fused_ops_reference_outputs_become_the_captures_memory():
    """Inside the emulated capture (``backend.capturing(memory=adopt)``, the seam), what a fused
    op's NumPy reference makes on the host, forward and backward, is emulated device memory, as a
    CuPy op's output is: reading it is refused. In a capture without a memory (CuPy's), as made."""
    x, weight, bias = (Tensor(EmulatedCapture.adopt(a), requires_grad=True) for a in
                       (np.arange(8, dtype=np.float32).reshape(2, 4), np.ones(4, np.float32), np.zeros(4, np.float32)))
    with backend.capturing(memory=EmulatedCapture.adopt):
        y = F.layer_norm(x, weight, bias)
        y.backward(Tensor(EmulatedCapture.adopt(np.ones((2, 4), np.float32))))
        assert all(type(a) is DeviceArray for a in (y.data, x.grad, weight.grad, bias.grad))
        with pytest.raises(backend.CaptureUnavailable, match="inside a captured step"):
            float(y.data[0, 0])
    with backend.capturing():
        assert type(F.layer_norm(x, weight, bias).data) is np.ndarray


@pytest.mark.parametrize("read", HOST_READS)
def test_emulated_device_arrays_refuse_host_reads_while_capturing(read):
    """As a CuPy array: indexing, iteration, reductions and ufuncs give device arrays, and reading
    one's value to the host inside a capture is refused (outside, it is the value)."""
    x = EmulatedCapture.adopt(np.arange(1, 7, dtype=np.int64))
    derived = [x[2], next(iter(x)), x.sum(), x.max(), (x * 2)[1], np.add(x, 1)[0], x.astype(np.float32)[0]]
    assert all(type(d) is DeviceArray and d.ndim == 0 for d in derived)
    with backend.capturing():
        for value in derived:
            with pytest.raises(backend.CaptureUnavailable, match="inside a captured step"):
                HOST_READS[read](value)
    assert HOST_READS[read](x[2]) == HOST_READS[read](np.int64(3))
    assert type(np.asarray(x)) is np.ndarray and np.shares_memory(np.asarray(x), x)


def test_a_host_read_in_the_step_refuses_the_capture(tmp_path, monkeypatch):
    """A read-back added inside the step (``float`` of the loss: on a GPU the capture would fail,
    or freeze the value) makes the emulated capture refuse: one warning, the steps run eagerly."""
    def batch_loss_read_back(*args, **kwargs):
        loss, nll = loss_of_batch(*args, **kwargs)
        float(loss.data)
        return loss, nll

    loss_of_batch = graphs.batch_loss
    monkeypatch.setattr(graphs, "batch_loss", batch_loss_read_back)
    warned = []
    trainer = set_up(graph_config(tmp_path), CountingCapture())
    trainer.graphs.warn = lambda message, category: warned.append(message)
    batch = trainer.train_data.batches(256, seed=0, epoch=0)[0]
    for _ in range(3):  # a warm-up, the capture given up, an eager step
        trainer.train_step([batch])
    assert warned == [("--cuda-graphs: float() reads a device array's value to the host inside a captured step; "
                       "the steps run eagerly (same kernels, same results)")]
    assert trainer.graphs.num_graphs == 0 and trainer.graphs.replays == 0 and trainer.adam.step_count == 3


def test_the_emulated_capture_executes_nothing_and_replays_with_the_recorded_seeds():
    """Capturing runs the step under the capture guard, hands its kernel seeds from the recorder
    (the slots) and leaves the device memory as it was; a replay runs it again with those seeds."""
    capture = EmulatedCapture()
    state = capture.adopt(np.zeros(3))
    table = capture.adopt(np.array([11, 22], dtype=np.uint64))
    handed = []

    def step():
        assert backend.is_capturing()
        handed.append(tf_random.kernel_seed(None))
        state[...] += 1

    slots = iter([DeviceSeed(table, 1)])
    with tf_random.recording_kernel_seeds(lambda generator: next(slots)):
        graph = capture.capture(step)
    assert state.tolist() == [0, 0, 0] and [s.index for s in handed] == [1]
    capture.replay(graph)
    capture.replay(graph)
    assert state.tolist() == [2, 2, 2] and [s.index for s in handed] == [1, 1, 1]
    handed.clear()
    graph.fn = lambda: [step(), step()]
    with pytest.raises(RuntimeError, match="more kernel seeds than its capture recorded"):
        capture.replay(graph)


def test_the_graphed_steps_gradients_are_views_of_one_buffer_rebuilt_when_one_is_replaced():
    """Zeroed with one launch (``GraphedStep.flat_grad``); a gradient there before is kept, and a
    gradient replaced by other code gets a new buffer rather than going stale (never zeroed again)."""
    from tinyformer.engine import amp
    from tinyformer.model import optim
    from tinyformer.model.nn import Transformer
    from tinyformer.translation.data.batching import Batch

    model = Transformer(src_vocab_size=30, d_model=32, heads=2, d_ff=48, num_layers=1, max_len=32, dropout=0.0, seed=0)
    params = [p for p in model.parameters() if p.requires_grad]
    params[0].grad = np.full(params[0].data.shape, 7.0, dtype=np.float32)
    step = graphs.GraphedStep(model, optim.Adam(model.parameters(), lr=1e-3), amp.get_precision("fp32"), 0.1, 256, 32,
                              EmulatedCapture(), warn=lambda *args: pytest.fail(str(args[0])))
    step._prepare()
    first = step.flat_grad
    assert all(np.shares_memory(p.grad, first) for p in params)
    assert np.all(params[0].grad == 7.0)  # kept
    for p in params:  # aligned as allocations are; inside a group packed back to back (Q, K, V) as the parameters
        alone = backend.root_buffer(p.data) is p.data
        alignment = step.GRADIENT_ALIGNMENT if alone else step.PACKED_ALIGNMENT
        assert (p.grad.ctypes.data - first.ctypes.data) % alignment == 0
    rng = np.random.default_rng(0)
    src, tgt = rng.integers(3, 30, (2, 6)), rng.integers(3, 30, (2, 7))
    batch = Batch(src, tgt[:, :-1], tgt[:, 1:], np.arange(2), pad_id=0)
    step.run([batch], batch.num_tokens)
    assert step.flat_grad is first and np.any(first != 0)
    params[1].grad = np.zeros_like(params[1].grad)  # replaced: no longer a view of the buffer
    step.run([batch], batch.num_tokens)
    assert step.flat_grad is not first and all(np.shares_memory(p.grad, step.flat_grad) for p in params)


# ================================================================== on the GPU
# The training step as CUDA graphs on a GPU (issue 17; skipped without a usable GPU).
#
# ``tinyformer train --cuda-graphs on`` pads each batch to its bucket (``data.ShapeBuckets``), runs
# the first batch of a shape eagerly, captures the second and replays the rest. Its results must
# not depend on which path ran: 100 steps with graphs give the losses and final parameters, bit for
# bit, of 100 eager steps (``cuda_graphs="off"``) on the same bucketed batches, i.e. the same
# kernels on the same shapes; a resume continues exactly; a failed capture falls back to the eager
# step with one warning. The eager run on the *unpadded* batches cannot match bit for bit (other
# shapes change the matrix products' reductions and dropout's element numbering); without dropout
# it matches to rounding (padding is masked).
#
# Runs are shared between tests (``finished_run``): each trains once per session.

STEPS, HALF = 100, 50
_RUNS = {}
_TOKENIZER = {}


def gpu_graph_config(save_dir, **overrides):
    values = dict(data="synthetic", preset="tiny", vocab_size=120, max_tokens=512, max_steps=STEPS, warmup_steps=50,
                  save_every=HALF, eval_every=1000, log_every=1, bleu_samples=8, dropout=0.1, device="cuda",
                  threads=1, precision="fp32", cuda_graphs="on", save_dir=str(save_dir))
    values.update(overrides)
    return TrainConfig(**values)


def shared_tokenizer(tmp_path_factory):
    """One joint BPE for every run (each run is handed it in its save_dir, as a resumed run finds its own)."""
    if "path" not in _TOKENIZER:
        folder = tmp_path_factory.mktemp("graph-tokenizer")
        config = gpu_graph_config(folder).resolved()
        _TOKENIZER["path"] = build_tokenizer(config, cached_load_corpus(config, "train"), echo=lambda *a: None).path
    return _TOKENIZER["path"]


def bucketed(trainer):
    """Make ``trainer``'s eager steps see the batches its graphs would: padded to their buckets."""
    c = trainer.config
    buckets = ShapeBuckets(c.max_tokens, c.shape_multiple, trainer.model.config.max_len)
    epoch_batches = trainer.train_data.batches
    trainer.train_data.batches = lambda *args, **kwargs: [buckets.pad(b) for b in epoch_batches(*args, **kwargs)]


def train_run(save_dir, tmp_path_factory, resume=False, pad_eager=False, **overrides):
    """Train ``gpu_graph_config(save_dir, **overrides)``; returns (trainer, echoed lines)."""
    save_dir.mkdir(parents=True, exist_ok=True)
    if not resume:
        shutil.copy(shared_tokenizer(tmp_path_factory), save_dir / "spm.model")
    lines = []
    trainer = Trainer(gpu_graph_config(save_dir, **overrides), resume=resume, echo=lines.append, progress=False)
    trainer.setup()
    if pad_eager:
        bucketed(trainer)
    trainer.run()
    return trainer, lines


def finished_run(tmp_path_factory, name, **overrides):
    """(save_dir, trainer, echoed lines) of a run trained once per session and shared by the tests."""
    key = (name, tuple(sorted(overrides.items())))
    if key not in _RUNS:
        save_dir = tmp_path_factory.mktemp(name)
        _RUNS[key] = (save_dir, *train_run(save_dir, tmp_path_factory, **overrides))
    return _RUNS[key]


def training_records(save_dir):
    with open(save_dir / "metrics.jsonl", encoding="utf-8") as f:
        return [r for r in map(json.loads, f) if "split" not in r and "skipped" not in r]


def parameters(save_dir, step):
    params, _, _ = checkpoint.load_checkpoint(checkpoint.checkpoint_path(save_dir, step))
    return params


def assert_same_parameters(a, b):
    assert sorted(a) == sorted(b)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def assert_same_training(graphed_dir, eager_dir, steps=STEPS):
    graphed, eager = training_records(graphed_dir)[:steps], training_records(eager_dir)[:steps]
    assert [r["step"] for r in graphed] == [r["step"] for r in eager] == list(range(1, steps + 1))
    assert [r["loss"] for r in graphed] == [r["loss"] for r in eager]
    assert [r["nll"] for r in graphed] == [r["nll"] for r in eager]
    # The norm only logs here (no clipping); the device may sum its squares in another order.
    np.testing.assert_allclose([r["grad_norm"] for r in graphed], [r["grad_norm"] for r in eager], rtol=1e-5,
                               atol=2e-5)
    assert_same_parameters(parameters(graphed_dir, steps), parameters(eager_dir, steps))


# ------------------------------------------------------------------ (a) graphs = eager, bit for bit
@devices.needs_gpu
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_graph_replays_give_the_eager_losses_and_parameters_bit_for_bit(tmp_path_factory, precision):
    graphed_dir, graphed, _ = finished_run(tmp_path_factory, f"graphs-{precision}", precision=precision)
    eager_dir, eager, _ = finished_run(tmp_path_factory, f"eager-{precision}", precision=precision,
                                       cuda_graphs="off", pad_eager=True)
    assert eager.graphs is None and graphed.graphs is not None and graphed.graphs.failed is None
    assert graphed.graphs.replays > 0  # the comparison covers replayed steps, not only eager ones
    assert graphed.step == eager.step == STEPS and graphed.skipped_updates == eager.skipped_updates == 0
    assert_same_training(graphed_dir, eager_dir)


@devices.needs_gpu
def test_graphs_on_unpadded_eager_batches_agree_to_rounding_without_dropout(tmp_path_factory):
    steps = 10
    graphed_dir, _, _ = finished_run(tmp_path_factory, "graphs-no-dropout", dropout=0.0, max_steps=steps)
    eager_dir, _, _ = finished_run(tmp_path_factory, "eager-unpadded-no-dropout", dropout=0.0, max_steps=steps,
                                   cuda_graphs="off")
    graphed, eager = training_records(graphed_dir), training_records(eager_dir)
    assert len(graphed) == len(eager) == steps
    np.testing.assert_allclose([r["loss"] for r in graphed], [r["loss"] for r in eager], rtol=1e-4)
    a, b = parameters(graphed_dir, steps), parameters(eager_dir, steps)
    # The key bias has a zero gradient (softmax ignores a score added to every key): Adam turns its
    # rounding noise into full steps of either sign, so it is left out; the rest agree to rounding.
    # Adam's first steps move an element by about lr whatever its gradient's size, so elements whose
    # gradient is near its rounding error differ by up to lr: on an H200 (2026-12-04) the largest
    # relative difference was 1.29e-4, in src_embed.weight; a padding that leaked into the sums
    # would differ by orders of magnitude more.
    for name in (n for n in a if not n.endswith("w_k.bias")):
        difference = np.linalg.norm((a[name] - b[name]).astype(np.float64))
        assert difference <= 3e-4 * max(np.linalg.norm(b[name].astype(np.float64)), 1e-6), name


# ------------------------------------------------------------------ (b) resume
@devices.needs_gpu
def test_resume_with_graphs_continues_exactly_on_the_gpu(tmp_path_factory):
    straight_dir, _, _ = finished_run(tmp_path_factory, "graphs-fp32", precision="fp32")
    resumed_dir = tmp_path_factory.mktemp("graphs-resumed")
    train_run(resumed_dir, tmp_path_factory, max_steps=HALF)
    assert [p.name for p in checkpoint.list_checkpoints(resumed_dir)] == [f"checkpoint_{HALF:07d}.npz"]
    resumed, lines = train_run(resumed_dir, tmp_path_factory, resume=True)
    assert any(f"resumed from checkpoint_{HALF:07d}.npz" in line for line in lines), lines
    assert resumed.step == STEPS and resumed.graphs.num_graphs >= 1
    assert_same_training(resumed_dir, straight_dir)


# ------------------------------------------------------------------ (c) shapes, graphs, pool
@devices.needs_gpu
def test_the_run_reports_few_shapes_its_graphs_and_their_pool(tmp_path_factory):
    save_dir, trainer, lines = finished_run(tmp_path_factory, "graphs-fp32", precision="fp32")
    step = trainer.graphs
    c = trainer.config
    visited = trainer.train_data.batches(c.max_tokens, seed=c.seed, epoch=0)[:STEPS]  # 100 steps of epoch 1
    buckets = ShapeBuckets(c.max_tokens, c.shape_multiple, trainer.model.config.max_len)
    expected = {buckets.shape(b) for b in visited}
    assert step.num_shapes == len(expected) < len({b.shape for b in visited})  # bucketing bounds the shapes
    assert 1 <= step.num_graphs <= step.num_shapes
    assert step.num_shapes + step.replays == STEPS  # one eager step per shape; every other step replayed
    assert step.pool_bytes() > 0
    launches = step.kernel_launches()
    assert len(launches) == step.num_graphs and all(n is None or n > 0 for n in launches.values())
    last = training_records(save_dir)[-1]
    assert last["graph_shapes"] == step.num_shapes and last["graphs"] == step.num_graphs
    assert last["graph_pool_mib"] > 0
    summary = [line for line in lines if line.startswith("CUDA graphs:")]
    assert summary == [f"CUDA graphs: {step.num_shapes} batch shapes, {step.num_graphs} graphs captured, "
                       f"{step.replays} steps replayed, private pool {step.pool_bytes() / 2 ** 20:.1f} MiB"]


# ------------------------------------------------------------------ (d) a failed capture
@devices.needs_gpu
def test_a_failed_capture_warns_once_and_gives_the_eager_losses(tmp_path_factory, monkeypatch):
    def refuse(self, fn):
        raise backend.CaptureUnavailable("test")

    monkeypatch.setattr(backend.GraphCapture, "capture", refuse)
    save_dir = tmp_path_factory.mktemp("graphs-refused")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer, _ = train_run(save_dir, tmp_path_factory, max_steps=HALF)
    runtime = [w for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(runtime) == 1 and "test" in str(runtime[0].message), [str(w.message) for w in runtime]
    assert trainer.graphs.failed == "test" and trainer.graphs.num_graphs == 0 and trainer.graphs.replays == 0
    eager_dir, _, _ = finished_run(tmp_path_factory, "eager-fp32", precision="fp32", cuda_graphs="off",
                                   pad_eager=True)
    assert_same_training(save_dir, eager_dir, steps=HALF)
