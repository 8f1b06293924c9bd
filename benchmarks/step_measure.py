"""The step benchmark's measurements: the machine's sgemm peak, the same-model check against PyTorch,
the timed steps (interleaved or in blocks: median, fastest, last loss), and ``measure`` /
``measure_graphs``, one preset's figures without and with CUDA graphs."""

import gc
import statistics
import time

import tinyformer  # noqa: F401  first: its OpenBLAS setting (common/blas_spin.py) must precede NumPy
import numpy

from step_batch import model_flops
from step_device import cupy_pool_growth, rss_growth, torch_cuda_growth, traced_peak
from step_runners import TinyformerGraphedRunner, TinyformerRunner
from step_torch import TorchGraphedRunner, TorchRunner, torch_kernel_launches
from torch_transformer import copy_weights

CHECK_ROWS = 8  # rows of the batch used for the same-model check (eval mode, no dropout)


PEAK_SHAPES = ((4096, 256, 1024), (4096, 1024, 256), (4672, 256, 8000), (2048, 2048, 2048))


def sgemm_peak(repeats=5, shapes=PEAK_SHAPES):
    """Measured float32 matrix-product rate of this machine (GFLOP/s): NumPy's (m×k)·(k×n) for the
    step's own shapes (feed-forward, output projection) and a square one, best of ``repeats``
    each after a warm-up; the highest rate is the peak."""
    rng = numpy.random.default_rng(0)
    rates = []
    for m, k, n in shapes:
        a = rng.standard_normal((m, k), dtype=numpy.float32)
        b = rng.standard_normal((k, n), dtype=numpy.float32)
        a @ b
        best = min(_seconds(lambda: a @ b) for _ in range(repeats))
        rates.append(2 * m * k * n / best / 1e9)
    return max(rates)


def _seconds(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def same_model_check(preset, tiny, torch_runner, batch, result, lines):
    """PyTorch's model with tinyformer's weights copied in: the same loss on the first rows (eval mode)."""
    result["torch_params"] = torch_runner.num_parameters()
    copy_weights(tiny.model, torch_runner.model)
    rows = min(CHECK_ROWS, len(batch["src"]))
    ours, theirs = tiny.eval_loss(rows), torch_runner.eval_loss(rows)
    lines.append(f"{preset}: same-model check (tinyformer's weights copied into PyTorch, eval mode, first "
                 f"{rows} rows): loss {ours:.6f} vs {theirs:.6f}, |diff| {abs(ours - theirs):.1e}; "
                 f"parameters {result['params']:,} vs {result['torch_params']:,} (stock nn.Transformer "
                 f"would add {torch_runner.model.stock_extra:,} for its final LayerNorms, removed here)")


def time_steps(runners, order, warmup, repeats, result):
    """Untimed then timed steps of (name, runner) pairs; puts each name's median, fastest step time
    and last loss into ``result``."""
    times = {name: [] for name, _ in runners}
    losses = {}

    def timed(name, runner):
        start = time.perf_counter()
        losses[name] = runner.step()
        times[name].append(time.perf_counter() - start)

    if order == "interleaved":  # machine noise hits both alike
        for _ in range(warmup):
            for _, runner in runners:
                runner.step()
        for _ in range(repeats):
            for name, runner in runners:
                timed(name, runner)
    else:  # each framework's warm-up and timed steps back to back, as in a real training run
        for name, runner in runners:
            for _ in range(warmup):
                runner.step()
            for _ in range(repeats):
                timed(name, runner)
    for name, _ in runners:
        result[f"{name}_median"] = statistics.median(times[name])
        result[f"{name}_min"] = min(times[name])
        result[f"{name}_loss"] = losses.get(name)


def measure(preset, args, batch, lines):
    tiny = TinyformerRunner(preset, args.vocab, batch, args.device, args.seed, args.precision)
    torch_runner = None
    result = {"preset": preset, "params": tiny.num_parameters()}
    result["flops"] = model_flops(tiny.config, result["params"], batch)
    if args.vs_torch:
        torch_runner = TorchRunner(tiny.config, batch, args.device, args.seed, args.precision)
        same_model_check(preset, tiny, torch_runner, batch, result, lines)

    runners = [("tf", tiny)] + ([("torch", torch_runner)] if torch_runner else [])
    time_steps(runners, args.order, args.warmup, args.repeats, result)

    # Memory: separate, untimed steps (tracing slows the step down).
    if args.device == "cuda":
        result["tf_mem"] = cupy_pool_growth(tiny.step)
        if torch_runner:
            result["torch_mem"] = torch_cuda_growth(torch_runner.step)
    else:
        result["tf_traced"] = traced_peak(tiny.step)
        if args.rss:
            result["tf_rss"] = rss_growth(tiny.step)
            if torch_runner:
                result["torch_rss"] = rss_growth(torch_runner.step)
    del tiny, torch_runner, runners
    gc.collect()
    return result


# ----------------------------------------------------------------------------- --cuda-graphs
#: issue 17's targets: tinyformer with graphs / PyTorch eager at 4,096 tokens, in the same precision
GRAPH_TARGETS = {"small": 0.5, "base": 0.8}
#: what each runner of --cuda-graphs is called in the table and notes
GRAPH_RUNNERS = {"tf_graphs": "tinyformer graphs", "tf": "tinyformer eager", "torch": "PyTorch eager",
                 "torch_graphs": "PyTorch graphs"}
PRIMING_STEPS = 2  # untimed steps of a graphed runner before the shared warm-up: tinyformer's eager + capture


def measure_graphs(preset, args, batch, lines, make_capture=None):
    """--cuda-graphs: tinyformer with graphs and eager, and with --vs-torch PyTorch eager and with its
    own graph, on the same batch from the same weights. A graphed runner that cannot be built or
    primed is left out, its reason in ``result["missing"]`` (the others are still timed)."""
    tiny = TinyformerRunner(preset, args.vocab, batch, args.device, args.seed, args.precision)
    result = {"preset": preset, "params": tiny.num_parameters(), "missing": {}}
    runners = []

    def primed(name, build):
        try:
            runner = build()
            for _ in range(PRIMING_STEPS):
                runner.step()
        except Exception as error:  # noqa: BLE001 - one figure is lost, not the run's others
            result["missing"][name] = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
            return None
        runners.append((name, runner))
        return runner

    graphed = primed("tf_graphs", lambda: TinyformerGraphedRunner(
        preset, args.vocab, batch, args.device, args.seed, args.precision,
        capture=None if make_capture is None else make_capture()))
    runners.append(("tf", tiny))
    torch_eager = None
    if args.vs_torch:
        torch_eager = TorchRunner(tiny.config, batch, args.device, args.seed, args.precision)
        same_model_check(preset, tiny, torch_eager, batch, result, lines)
        runners.append(("torch", torch_eager))

        def torch_graphed():
            runner = TorchGraphedRunner(tiny.config, batch, args.device, args.seed, args.precision)
            copy_weights(tiny.model, runner.model)
            return runner

        primed("torch_graphs", torch_graphed)
    runners.sort(key=lambda pair: list(GRAPH_RUNNERS).index(pair[0]))
    time_steps(runners, args.order, args.warmup, args.repeats, result)

    if graphed is not None:
        result["tf_graphs_launches"] = graphed.launches()
        result["tf_graphs_pool"] = graphed.graphed.pool_bytes()
        result["tf_graphs_shapes"] = graphed.graphed.num_shapes
        reason = graphed.unavailable()
        if reason:
            result["missing"]["tf_graphs"] = reason
    if torch_eager is not None:
        result["torch_launches"] = torch_kernel_launches(torch_eager.step)
    del tiny, graphed, torch_eager, runners
    gc.collect()
    return result
