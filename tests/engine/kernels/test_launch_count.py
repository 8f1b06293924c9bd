"""Launches counted: the seams that count them (``backend.counting_launches``: each kernel of
``engine.kernels``, each cuBLAS product and the copies it needs), a captured step's count on the
CPU's emulated capture (the same seams, and the array operations on its memory), and the CUDA
driver's count of a real graph's nodes (``backend.graph_nodes``, here over a fake driver)."""

import collections

import numpy as np
import pytest

from tinyformer import Tensor
from tinyformer.engine import amp, backend, kernels
from tinyformer.engine import functional as F
from tinyformer.engine.backend import cuda_graphs
from tinyformer.engine.kernels import cublas
from tinyformer.model import optim
from tinyformer.model.nn import Transformer
from tinyformer.model.nn.output_bias import LeavesOutputBias
from tinyformer.translation.data.batching import Batch
from tinyformer.translation.train.graphs import GraphedStep

from emulated_capture import EmulatedCapture


class FakeDriver:
    """Graphs as {handle: [(node, type)]}; a child-graph node's graph is ``children[node]``."""

    def __init__(self, graphs, children):
        self.graphs, self.children = graphs, children

    def nodes(self, graph):
        return [node for node, _ in self.graphs[graph]]

    def node_type(self, node):
        return next(kind for nodes in self.graphs.values() for n, kind in nodes if n == node)

    def child_graph(self, node):
        return self.children[node]


def test_graph_nodes_counts_by_type_and_counts_child_graphs_in_place():
    driver = FakeDriver({1: [(10, 0), (11, 0), (12, 2), (13, 4)], 2: [(20, 0), (21, 1), (22, 4)], 3: [(30, 0), (31, 99)]},
                        {13: 2, 22: 3})
    counts = backend.graph_nodes(1, driver)
    assert counts == collections.Counter({"kernel": 4, "memset": 1, "memcpy": 1, "type 99": 1})
    assert "graph" not in counts


def test_the_driver_wrapper_declares_the_calls_it_makes():
    """``Driver`` over a stand-in library: the argument types are declared, the counts read back."""
    class Function:
        def __init__(self, body):
            self.body, self.argtypes = body, None

        def __call__(self, *args):
            return self.body(*args)

    def get_nodes(graph, nodes, count):
        count._obj.value = 2
        if nodes is not None:
            nodes[0], nodes[1] = 5, 6
        return 0

    def get_type(node, kind):
        kind._obj.value = 0 if node == 5 else 2
        return 0

    library = type("Library", (), {})()
    library.cuGraphGetNodes, library.cuGraphNodeGetType = Function(get_nodes), Function(get_type)
    library.cuGraphChildGraphNodeGetGraph = Function(lambda node, graph: 1)
    driver = cuda_graphs.Driver(library)
    assert all(f.argtypes for f in (library.cuGraphGetNodes, library.cuGraphNodeGetType))
    assert backend.graph_nodes(7, driver) == collections.Counter({"kernel": 1, "memset": 1})
    with pytest.raises(RuntimeError, match="cuGraphChildGraphNodeGetGraph failed with CUresult 1"):
        driver.child_graph(5)


def test_counting_launches_counts_in_every_enclosing_block():
    with backend.counting_launches() as outer:
        backend.note_launch("a")
        with backend.counting_launches() as inner:
            backend.note_launch("b", 3)
    backend.note_launch("c")  # outside every block: nowhere
    assert outer == {"a": 1, "b": 3} and inner == {"b": 3}


def test_a_kernel_launch_is_counted_under_its_name(monkeypatch):
    monkeypatch.setattr(kernels, "on_gpu", lambda *arrays: True)  # the fused op through the emulated kernel
    x = np.random.default_rng(0).standard_normal((4, 40)).astype(np.float32)
    with backend.counting_launches() as launches:
        F.softmax(Tensor(x), axis=-1)
    assert launches == {"softmax_forward": 1}


def test_a_product_counts_its_gemm_and_the_copies_cublas_would_need():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((2, 3, 8)).astype(np.float32), rng.standard_normal((8, 5)).astype(np.float32)
    with backend.counting_launches() as launches:
        cublas.matmul(a, b)  # b broadcast over the batch: one strided-batched GEMM, nothing copied
        cublas.matmul(a.transpose(0, 2, 1), a)  # an F-ordered operand: read transposed in place
    assert launches == {"cublas_gemm": 2}
    wide = rng.standard_normal((3, 16)).astype(np.float32)
    with backend.counting_launches() as launches:
        cublas.matmul(wide[:, ::2], b)  # every other column: cuBLAS cannot read it
        cublas.matmul(a[0], b, out=np.empty((5, 3), np.float32).T)  # a result it cannot write in place
        cublas.matmul(a[0], b.astype(np.float64))  # mixed types: CuPy's product
    assert launches == {"cublas_gemm": 2, "copy (operand to C order)": 1, "copy (product into out)": 1,
                        "cupy_matmul": 1}


def captured_step_launches(tokens, num_layers=1, precision="fp32", seed=0):
    """The launches of one captured training step of a model whose heads have a kernel (d_k = 32)."""
    model = Transformer(src_vocab_size=40, d_model=64, heads=2, d_ff=96, num_layers=num_layers, max_len=64,
                        dropout=0.1, seed=seed)
    model.train()
    adam = optim.Adam(model.parameters(), lr=1e-3)
    capture = EmulatedCapture()
    step = GraphedStep(model, adam, amp.get_precision(precision), 0.1, 4 * tokens, 64, capture,
                       warn=lambda *args: pytest.fail(f"the capture was given up: {args[0]}"))
    rng = np.random.default_rng(seed)
    rows = max(1, tokens // 8)
    src, tgt = rng.integers(3, 40, (rows, 8)), rng.integers(3, 40, (rows, 9))
    batch = Batch(src, tgt[:, :-1], tgt[:, 1:], np.arange(rows), pad_id=0)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(kernels, "on_gpu", lambda *arrays: True)
        for _ in range(2):  # eager warm-up, then captured and replayed
            step.run([batch], batch.num_tokens)
    (launches,) = step.launch_counts().values()
    (nodes,) = step.kernel_launches().values()
    assert nodes == sum(launches.values())
    return model, launches


def test_a_captured_steps_launches_follow_the_models_structure():
    model, launches = captured_step_launches(tokens=16)
    encoder, decoder = model.config.encoder_layers or 1, model.config.decoder_layers or 1
    attentions = encoder + 2 * decoder
    for kernel in ("attention_forward", "attention_backward_delta", "attention_backward_kv", "attention_backward_q"):
        assert launches[kernel] == attentions, kernel
    # layer norm's dw and db: summed inside each backward kernel, one reduction launch each (no second
    # pass over the rows) adding into the parameters' gradients
    norms = launches["residual_layer_norm_backward"] + launches["layer_norm_backward_input"]
    assert launches["layer_norm_reduce_params"] == norms and "layer_norm_backward_params" not in launches
    # the input of each stack (lookup, √d scale, positions, dropout) in one launch each way
    assert launches["embedding_forward"] == launches["embedding_backward"] == 2 and "dropout_forward" not in launches
    # products: self-attention's Q, K, V as one and W_O; attention over a memory Q, then K and V as one,
    # and W_O; 2 per feed-forward network; 1 for the logits. Each product's backward gives its two
    # operands' gradients: 3 GEMMs per product; a bias's gradient one more (column sums), but W_O's and
    # W₂'s, which the residual node adds and sums beside layer norm's dw and db.
    products = 2 * (encoder + decoder) + 3 * decoder + 2 * (encoder + decoder) + 1
    bias_sums = (encoder + decoder) + 2 * decoder + (encoder + decoder)  # QKV's; Q's and KV's; W₁'s
    assert launches["cublas_gemm"] == 3 * products + bias_sums
    sublayers = 2 * encoder + 3 * decoder
    assert launches["residual_layer_norm_forward"] == launches["residual_layer_norm_backward"] == sublayers
    assert launches["adam_update"] == launches["adam_norm_partials"] == 1
    parameters = sum(1 for p in model.parameters() if p.requires_grad)
    assert launches["array op: fill"] == 2  # every gradient zeroed at once (one buffer), and the loss totals
    assert parameters > 2


def test_the_output_projections_bias_costs_no_launch_of_its_own(monkeypatch):
    """Post-LN, W_O's and W₂'s bias are the residual node's: one bias add fewer each forward and one
    column-sum GEMM fewer each backward per sublayer, every other launch the same."""
    _, folded = captured_step_launches(tokens=16)
    monkeypatch.setattr(LeavesOutputBias, "output", lambda self, linear, x: linear(x))  # each adds its own
    _, unfolded = captured_step_launches(tokens=16)
    sublayers = folded["residual_layer_norm_forward"]
    assert sublayers == 5  # encoder: attention, feed-forward; decoder: self, cross, feed-forward
    difference = {family: unfolded[family] - folded.get(family, 0) for family in unfolded
                  if unfolded[family] != folded.get(family, 0)}
    assert difference == {"array op: add": sublayers, "cublas_gemm": sublayers}


def test_a_captured_steps_launches_do_not_depend_on_the_batch(monkeypatch):
    """Not even where NumPy splits large work into row blocks on several threads: a count is of
    launches as a device makes them, one an operation (``backend.is_counting_launches``)."""
    _, few = captured_step_launches(tokens=16)
    threads = backend.get_num_threads()
    monkeypatch.setattr(backend.threads, "ROW_BLOCK_MIN_ELEMENTS", 4)  # every array large enough to split
    monkeypatch.setattr(backend.threads, "CACHE_BLOCK_ELEMENTS", 64)
    backend.set_num_threads(2)
    try:
        _, more = captured_step_launches(tokens=48, seed=1)
    finally:
        backend.set_num_threads(threads)
    assert few == more
    _, deeper = captured_step_launches(tokens=16, num_layers=2)
    assert sum(deeper.values()) > sum(few.values())


def test_each_launch_records_the_bytes_it_moves_and_its_flops(monkeypatch):
    monkeypatch.setattr(kernels, "on_gpu", lambda *arrays: True)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 40)).astype(np.float32)
    a, b = rng.standard_normal((2, 3, 8)).astype(np.float32), rng.standard_normal((8, 5)).astype(np.float32)
    q, k, v = (rng.standard_normal((2, 2, n, 32)).astype(np.float32) for n in (5, 7, 7))
    with backend.counting_launches() as launches:
        F.softmax(Tensor(x), axis=-1)
        cublas.matmul(a, b)
        F.scaled_dot_product_attention(Tensor(q), Tensor(k), Tensor(v))
    softmax, gemm, attention = launches.records
    assert (softmax.family, softmax.bytes, softmax.flops) == ("softmax_forward", 2 * x.nbytes, 0)
    assert (gemm.family, gemm.flops, gemm.compute) == ("cublas_gemm", 2 * 2 * 3 * 5 * 8, "fp32")
    assert gemm.bytes == a.nbytes + b.nbytes + 2 * 3 * 5 * 4  # b read once though broadcast over the batch
    assert attention.family == "attention_forward" and attention.compute == "fp32"
    assert attention.flops == 4 * 2 * 2 * 5 * 7 * 32  # S = QKᵀ and PV, 2 FLOPs a multiply-add
    lse = 2 * 2 * 5 * 4
    assert attention.bytes == q.nbytes + k.nbytes + v.nbytes + q.nbytes + lse  # q, k, v read; o, lse written


def test_adams_launches_count_every_parameter_once_per_pass():
    model, launches = captured_step_launches(tokens=16)
    elements = sum(p.data.size for p in model.parameters() if p.requires_grad)
    norm, update = ([r for r in launches.records if r.family == f] for f in ("adam_norm_partials", "adam_update"))
    assert [r.bytes for r in norm] == [4 * elements]  # the gradients read
    assert [r.bytes for r in update] == [7 * 4 * elements]  # p, g, m, v read; p, m, v written


def test_the_cost_model_takes_the_longer_of_bytes_and_flops_and_never_less_than_the_floor():
    from scripts import load_script

    model = load_script("benchmarks/launch_count.py")
    h200 = model.GPUS["H200"]
    moving = backend.Launch("x", bytes=int(48e6), flops=0)  # 10 µs at 4.8 TB/s
    computing = backend.Launch("cublas_gemm", bytes=1000, flops=int(67e9), compute="fp32")  # 1 ms at 67 TFLOP/s
    tensor = backend.Launch("cublas_gemm", bytes=1000, flops=int(67e9), compute="tensor")
    assert model.predicted_seconds(moving, "H200", 3e-6) == pytest.approx(48e6 / h200["bandwidth"])
    assert model.predicted_seconds(computing, "H200", 3e-6) == pytest.approx(1e-3)
    assert model.predicted_seconds(tensor, "H200", 3e-6) == pytest.approx(67e9 / 989e12)
    assert model.predicted_seconds(backend.Launch("tiny", bytes=8), "H200", 3e-6) == 3e-6
    rows = model.cost_table([moving, computing, backend.Launch("array op: add", bytes=8)], "H200", 3e-6)
    assert rows[-1].startswith("| **step** | 3 |") and "1.013" in rows[-1]


def test_the_cost_model_extrapolates_a_large_step_exactly_from_two_small_ones():
    """Every launch's bytes and FLOPs are affine in the batch's rows (padded length fixed): the
    launches counted at 2 and 4 rows, extrapolated to 8, are the launches counted at 8."""
    from scripts import load_script

    model = load_script("benchmarks/launch_count.py")
    counted = {tokens: captured_step_launches(tokens=tokens)[1].records for tokens in (16, 32, 64)}
    predicted = model.extrapolated(counted[16], counted[32], 2, 4, 8)
    assert [(p.family, p.bytes, p.flops, p.compute) for p in predicted] == \
        [(c.family, c.bytes, c.flops, c.compute) for c in counted[64]]
    assert sum(p.bytes for p in predicted) > sum(c.bytes for c in counted[32])
