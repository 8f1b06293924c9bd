"""One training step of the Transformer (forward, backward, Adam) at about 4,096 target tokens.

For each preset (default ``small`` and ``base``) builds ``Transformer.from_preset`` with a
shared vocabulary and times whole training steps on one fixed, seeded batch of sentence pairs:

    zero_grad; logits = model(src, tgt_in);
    loss = cross_entropy(logits, tgt_out, label_smoothing=0.1, ignore_index=pad);
    loss.backward(); Adam(betas=(0.9, 0.98), eps=1e-9, lr=NoamSchedule(d_model, 4000)).step()

in training mode (dropout as in the preset). It prints the median and the fastest step time,
tokens/s (target tokens / median) and the peak memory of one step. ``--vs-torch`` builds the same
model in PyTorch (post-LN ``nn.Transformer``, tied embeddings, same batch, same weights), checks
that both give the same loss, and times the two in the same run: interleaved step by step
(default), or ``--order blocks``, each framework's steps back to back as in a real training run.

``--device cuda --cuda-graphs`` (issue 17) times, side by side in one run, tinyformer's step
captured as a CUDA graph (``train.graphs.GraphedStep``, as ``tinyformer train --cuda-graphs on``
runs it) and eager, and with ``--vs-torch`` PyTorch eager and PyTorch's own capture of the same
whole step (``torch.cuda.graph``, static inputs, warm-up on a side stream, ``Adam(capturable=True)``);
it prints the ratios of tinyformer with graphs to both and the kernel launches per step.

    python benchmarks/bench_step.py [--preset small,base] [--tokens 4096] [--vs-torch] [--markdown]
    python benchmarks/bench_step.py --device cuda --cuda-graphs --vs-torch [--precision bf16]
"""

import argparse
import ctypes
import datetime
import gc
import os
import platform
import shlex
import statistics
import sys
import time
import tracemalloc

import tinyformer  # noqa: F401  first: its OpenBLAS setting (common/blas_spin.py) must precede NumPy
import numpy

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_transformer import build_torch_model, copy_weights  # noqa: E402,F401  (benchmarks/ is not a package)

PAD, BOS, EOS = 0, 1, 2  # token ids; real words are drawn from [3, vocab)
LABEL_SMOOTHING = 0.1  # §5.4, as `tinyformer train` (TrainConfig.label_smoothing)
CHECK_ROWS = 8  # rows of the batch used for the same-model check (eval mode, no dropout)


# ----------------------------------------------------------------------------- the batch
def make_batch(tokens, length, vocab, seed):
    """Sentence pairs padded to ``length``, rows added until the target holds ``tokens`` tokens.

    Source and target lengths are drawn uniformly from [length - length // 4, length] (a
    length-bucketed batch, as a token-based batcher builds); the last row's target is cut so the
    count is exact. A target of n tokens (words plus EOS) gives tgt_in = BOS w1 .. w(n-1) and
    tgt_out = w1 .. w(n-1) EOS; the target token count is the number of non-pad tgt_out positions
    (fairseq's ``ntokens``).
    """
    if vocab < 4:
        raise SystemExit("--vocab must be at least 4 (pad, bos, eos and one word)")
    rng = numpy.random.default_rng(seed)
    low = max(1, length - length // 4)
    src_lens, tgt_lens, total = [], [], 0
    while total < tokens:
        n = min(int(rng.integers(low, length + 1)), tokens - total)
        src_lens.append(int(rng.integers(low, length + 1)))
        tgt_lens.append(n)
        total += n
    rows = len(tgt_lens)
    src = numpy.full((rows, length), PAD, dtype=numpy.int64)
    tgt_in = numpy.full((rows, length), PAD, dtype=numpy.int64)
    tgt_out = numpy.full((rows, length), PAD, dtype=numpy.int64)
    for i, (s, n) in enumerate(zip(src_lens, tgt_lens)):
        src[i, :s] = rng.integers(3, vocab, s)
        words = rng.integers(3, vocab, n - 1)
        tgt_in[i, 0], tgt_in[i, 1:n] = BOS, words
        tgt_out[i, :n - 1], tgt_out[i, n - 1] = words, EOS
    return {"src": src, "tgt_in": tgt_in, "tgt_out": tgt_out,
            "tgt_tokens": int((tgt_out != PAD).sum()), "src_tokens": int((src != PAD).sum())}


# ----------------------------------------------------------------------------- devices
def synchronize(device):
    if device == "cuda":
        import cupy

        cupy.cuda.Device().synchronize()
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available():
            torch.cuda.synchronize()


# ----------------------------------------------------------------------------- memory
def _read_status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024  # kB
    raise OSError(f"{field} not in /proc/self/status")


def rss_probe_available():
    """Linux only: resettable peak RSS (/proc/self/clear_refs, Linux >= 4.0) and glibc's malloc_trim."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        _read_status("VmHWM")
        ctypes.CDLL(None).malloc_trim
        return True
    except (OSError, AttributeError):
        return False


def rss_growth(step):
    """Peak resident set during ``step()`` minus the resident set just before it, in bytes.

    Freed heap pages are first handed back to the OS (``malloc_trim``) so that memory reused from
    earlier steps is counted again; then the kernel's high-water mark is reset and read after the
    step. Works alike for NumPy and PyTorch (whose CPU tensors come from malloc too).
    """
    gc.collect()
    ctypes.CDLL(None).malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = _read_status("VmRSS")
    step()
    return _read_status("VmHWM") - before


def traced_peak(step):
    """Peak of the bytes allocated during ``step()`` and still live, as tracemalloc sees them."""
    gc.collect()
    tracemalloc.start()
    try:
        step()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def cupy_pool_growth(step):
    """Bytes CuPy's default memory pool grows to during ``step()`` above what was in use before it."""
    import cupy

    pool = cupy.get_default_memory_pool()
    synchronize("cuda")
    pool.free_all_blocks()
    before = pool.used_bytes()
    step()
    synchronize("cuda")
    return pool.total_bytes() - before


def torch_cuda_growth(step):
    import torch

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


# ----------------------------------------------------------------------------- tinyformer
class TinyformerRunner:
    def __init__(self, preset, vocab, batch, device, seed, precision="fp32"):
        import tinyformer as tf
        from tinyformer.engine import amp, backend, functional as F
        from tinyformer.model import optim
        from tinyformer.model.nn import Transformer
        from tinyformer.translation.data.batching import Batch
        from tinyformer.translation.train.evaluation import batch_loss

        self.F, self.tf, self.amp, self.precision, self.batch_loss = F, tf, amp, precision, batch_loss
        tf.manual_seed(seed)
        self.model = Transformer.from_preset(preset, vocab_size=vocab, pad_id=PAD, seed=seed)
        self.config = self.model.config.to_dict()
        if device == "cuda":
            self.model.to("cuda")
        else:  # as Trainer does on the CPU: each step's large arrays reuse the last step's memory
            backend.keep_freed_memory()
        self.model.train()
        self.optimizer = optim.Adam(self.model.parameters(), lr=optim.NoamSchedule(self.config["d_model"], 4000),
                                    betas=(0.9, 0.98), eps=1e-9)
        move = (lambda a: backend.to_device(a, "cuda")) if device == "cuda" else (lambda a: a)
        self.src, self.tgt_in, self.tgt_out = (move(batch[k]) for k in ("src", "tgt_in", "tgt_out"))
        # The trainer's batch (host arrays, as Trainer.train_step hands them to batch_loss)
        self.batch = Batch(batch["src"], batch["tgt_in"], batch["tgt_out"], numpy.arange(len(batch["src"])),
                           pad_id=PAD)
        self.device = device
        self.smoothing = LABEL_SMOOTHING
        self.scaler = optim.GradScaler(enabled=amp.get_precision(precision).loss_scaling)

    def num_parameters(self):
        return self.model.num_parameters()

    def step(self):
        """One training step as ``Trainer.train_step`` computes its loss (``batch_loss``: on the CPU the
        logits of the counted target positions only), divided by the batch's target tokens."""
        self.optimizer.zero_grad()
        with self.amp.autocast(self.precision):
            loss_sum, _ = self.batch_loss(self.model, self.batch, self.smoothing)
            loss = loss_sum / self.batch.num_tokens
            self.scaler.scale_loss(loss).backward()
        self.scaler.step(self.optimizer)
        value = loss.item()
        synchronize(self.device)
        return value

    def eval_loss(self, rows):
        self.model.eval()
        try:
            with self.tf.no_grad(), self.amp.autocast(self.precision):
                logits = self.model(self.src[:rows], self.tgt_in[:rows])
                loss = self.F.cross_entropy(logits, self.tgt_out[:rows], label_smoothing=self.smoothing,
                                            ignore_index=PAD)
            return loss.item()
        finally:
            self.model.train()


class TinyformerGraphedRunner(TinyformerRunner):
    """tinyformer's step as ``tinyformer train --cuda-graphs on`` runs it: a ``train.graphs.GraphedStep``
    over the bench's batch as a ``data.Batch`` (its shape is its own bucket: the rows fill the
    token budget and 32 is a multiple of 8). Its first step runs eagerly, the second captures the
    graph, later ones copy the batch into the static inputs and replay. ``capture``: a
    ``backend.GraphCapture`` (made here on the GPU) or, in tests, ``EmulatedCapture``
    (tests/emulated_capture.py)."""

    def __init__(self, preset, vocab, batch, device, seed, precision="fp32", capture=None):
        super().__init__(preset, vocab, batch, device, seed, precision)
        from tinyformer.engine import backend
        from tinyformer.translation.train.graphs import GraphedStep

        rows, src_len, tgt_len = self.batch.shape
        # A capture that is given up is reported from GraphedStep.failed (unavailable()), not as a warning.
        self.graphed = GraphedStep(self.model, self.optimizer, self.amp.get_precision(precision), self.smoothing,
                                   rows * max(src_len, tgt_len), self.config["max_len"],
                                   backend.GraphCapture() if capture is None else capture,
                                   warn=lambda message, category=None: None)

    def step(self):
        scale = self.scaler.scale if self.scaler.enabled else 1.0
        loss_sum, _, _, applied = self.graphed.run([self.batch], self.batch.num_tokens, scale)
        if self.scaler.enabled:
            self.scaler.update(not applied)
        synchronize(self.device)
        return loss_sum / self.batch.num_tokens

    def launches(self):
        """Kernel launches per replayed step (one captured shape here), or None where unknown."""
        counts = [n for n in self.graphed.kernel_launches().values() if n is not None]
        return counts[0] if len(counts) == 1 else None

    def unavailable(self):
        """Why the timed steps were not graph replays (capture given up, or none captured), or None."""
        if self.graphed.failed:
            return f"capture given up ({self.graphed.failed}); the steps ran eagerly"
        if self.graphed.num_graphs == 0:
            return "no graph was captured"
        return None


# ----------------------------------------------------------------------------- PyTorch
TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}


class TorchRunner:
    """PyTorch's step on the same model; in bf16/fp16 under ``torch.autocast`` (with its GradScaler
    for fp16): fp32 weights and Adam, the products in the half type, as tinyformer's amp."""

    def __init__(self, config, batch, device, seed, precision="fp32"):
        import torch
        from torch.nn import functional as TF

        from tinyformer.model.optim import NoamSchedule

        self.torch, self.TF = torch, TF
        self.half = getattr(torch, TORCH_DTYPES[precision]) if precision in TORCH_DTYPES else None
        self.scaler = torch.amp.GradScaler(device, enabled=precision == "fp16")
        torch.manual_seed(seed)
        self.device = device
        self.model = build_torch_model(config, device)
        self.model.train()
        self.vocab = config["src_vocab_size"]
        self.smoothing = LABEL_SMOOTHING
        noam = NoamSchedule(config["d_model"], 4000)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
        # LambdaLR counts from 0; tinyformer's schedule from 1.
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda i: noam(i + 1))
        self.src, self.tgt_in, self.tgt_out = (torch.from_numpy(batch[k]).to(device)
                                               for k in ("src", "tgt_in", "tgt_out"))

    def num_parameters(self):
        return sum(p.numel() for p in self.model.parameters())

    def _loss(self, logits, target):
        return self.TF.cross_entropy(logits.reshape(-1, self.vocab), target.reshape(-1), ignore_index=PAD,
                                     label_smoothing=self.smoothing)

    def _autocast(self):
        return self.torch.autocast(self.device, dtype=self.half, enabled=self.half is not None)

    def step(self):
        self.optimizer.zero_grad(set_to_none=True)
        with self._autocast():
            loss = self._loss(self.model(self.src, self.tgt_in), self.tgt_out)
        self.scaler.scale(loss).backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.scheduler.step()
        value = loss.item()
        synchronize(self.device)
        return value

    def eval_loss(self, rows):
        # Grad stays enabled so that PyTorch takes its ordinary path, not the inference fast path.
        self.model.eval()
        try:
            with self._autocast():
                loss = self._loss(self.model(self.src[:rows], self.tgt_in[:rows]), self.tgt_out[:rows])
            return loss.item()
        finally:
            self.model.train()


class TorchGraphedRunner(TorchRunner):
    """PyTorch's whole step captured as one CUDA graph, after PyTorch's documented whole-network
    recipe (CUDA semantics, "Whole-network capture"): static input tensors, warm-up steps on a side
    stream, gradients set to None before the capture so that backward allocates them from the
    graph's pool, then forward, loss, backward and ``Adam(capturable=True)``'s step under
    ``torch.cuda.graph``; each later step copies the batch into the static inputs, writes the
    learning rate (a device tensor: a Python float would be baked into the graph) and replays.
    Autocast runs with ``cache_enabled=False``, as graphs require. fp16's GradScaler skips an
    overflowing update on the device only with a fused optimiser, so in fp16 Adam is also
    ``fused=True``. The capture happens at the first ``step()`` (after the weights were copied in)."""

    WARMUP_STEPS = 3  # the recipe's side-stream iterations before the capture

    def __init__(self, config, batch, device, seed, precision="fp32"):
        super().__init__(config, batch, device, seed, precision)
        from tinyformer.model.optim import NoamSchedule

        torch = self.torch
        self.noam, self.steps = NoamSchedule(config["d_model"], 4000), 0
        self.lr = torch.tensor(self.noam(1), dtype=torch.float32, device=device)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=self.lr, betas=(0.9, 0.98), eps=1e-9,
                                          capturable=True, fused=True if precision == "fp16" else None)
        self.scheduler = None
        self.host = {k: torch.from_numpy(batch[k]) for k in ("src", "tgt_in", "tgt_out")}
        self.graph, self.static_loss = None, None

    def _autocast(self):
        return self.torch.autocast(self.device, dtype=self.half, enabled=self.half is not None, cache_enabled=False)

    def _body(self):
        """The step that is captured: no host read, no Python number that changes."""
        with self._autocast():
            loss = self._loss(self.model(self.src, self.tgt_in), self.tgt_out)
        self.scaler.scale(loss).backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        return loss

    def _next_lr(self):
        self.steps += 1
        self.lr.fill_(self.noam(self.steps))

    def _load_batch(self):
        for name, static in (("src", self.src), ("tgt_in", self.tgt_in), ("tgt_out", self.tgt_out)):
            static.copy_(self.host[name])

    def _capture(self):
        torch = self.torch
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(self.WARMUP_STEPS):
                self._next_lr()
                self.optimizer.zero_grad(set_to_none=True)
                self._body()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        self.optimizer.zero_grad(set_to_none=True)
        with torch.cuda.graph(self.graph):
            self.static_loss = self._body()

    def step(self):
        if self.graph is None:
            self._capture()
        self._load_batch()
        self._next_lr()
        self.graph.replay()
        value = self.static_loss.item()
        synchronize(self.device)
        return value


def count_kernels(events, cuda_type):
    """Kernel launches among profiler events: device events of ``cuda_type`` that are not memory
    copies or sets (``torch.profiler`` names those "Memcpy ..." and "Memset ...")."""
    return sum(1 for e in events if e.device_type == cuda_type and not e.name.startswith(("Memcpy", "Memset")))


def torch_kernel_launches(step):
    """CUDA kernels of one call of ``step`` as ``torch.profiler`` (activities CUDA) sees them; None
    where the profiler is unavailable or saw no kernel (no CUPTI)."""
    try:
        import torch
        from torch.profiler import ProfilerActivity, profile

        synchronize("cuda")
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            step()
            torch.cuda.synchronize()
        count = count_kernels(prof.events(), torch.autograd.DeviceType.CUDA)
    except Exception:  # noqa: BLE001 - a missing profiler makes the figure n/a, not the benchmark fail
        return None
    return count or None


# ----------------------------------------------------------------------------- reporting
def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def blas_info():
    try:
        blas = numpy.show_config(mode="dicts")["Build Dependencies"]["blas"]
        name = f"{blas.get('name', '?')} {blas.get('version', '')}".strip()
    except Exception:
        name = "unknown BLAS"
    try:
        from threadpoolctl import threadpool_info

        threads = sorted({f"{p['internal_api']} {p['num_threads']} threads" for p in threadpool_info()
                          if p.get("user_api") == "blas"})
        return f"{name} ({', '.join(threads) or 'thread count unknown'}, via threadpoolctl)"
    except ImportError:
        env = [f"{k}={os.environ[k]}" for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
               if k in os.environ]
        return f"{name} ({', '.join(env) or 'threads: library default'}; threadpoolctl not installed)"


def command_line():
    script = sys.argv[0]
    try:
        script = os.path.relpath(script)
    except ValueError:
        pass
    if os.path.isabs(script) or script.startswith(".."):
        script = os.path.join("benchmarks", os.path.basename(script))
    return " ".join(["python", shlex.quote(script), *map(shlex.quote, sys.argv[1:])])


def model_flops(config, params, batch):
    """FLOPs of one training step: 6 · parameters · tokens plus attention.

    tokens: the target tokens (fairseq's ntokens). Attention adds, per layer and forward
    pass, 4·rows·len_q·len_k·d_model (QKᵀ and PV over all heads), three times that for forward
    plus backward: encoder self (src × src), decoder self (tgt × tgt) and cross (tgt × src),
    on the padded lengths.
    """
    rows, len_src = batch["src"].shape
    len_tgt = batch["tgt_in"].shape[1]
    d, layers = config["d_model"], config["num_layers"]
    pairs = layers * (len_src * len_src + len_tgt * len_tgt + len_tgt * len_src)
    return 6 * params * batch["tgt_tokens"] + 3 * 4 * rows * pairs * d


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


def mb(value):
    return "n/a" if value is None else f"{value / 2**20:,.0f}"


def print_table(header, rows, markdown):
    if markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|")
        for row in rows:
            print("| " + " | ".join(row) + " |")
        return
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    fmt = lambda cells: "  ".join(c.ljust(w) if i == 0 else c.rjust(w)  # noqa: E731
                                  for i, (c, w) in enumerate(zip(cells, widths)))
    print(fmt(header))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print(fmt(row))


# ----------------------------------------------------------------------------- main
def parse_presets(values):
    from tinyformer.model.nn.presets import check_preset

    names = [n.strip() for v in (values or ["small,base"]) for n in v.split(",") if n.strip()]
    try:
        return [check_preset(n) for n in names]
    except ValueError as error:
        raise SystemExit(f"--preset: {error}") from None


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
    result["flops"] = model_flops(tiny.config.to_dict(), result["params"], batch)
    if args.vs_torch:
        torch_runner = TorchRunner(tiny.config.to_dict(), batch, args.device, args.seed, args.precision)
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
        torch_eager = TorchRunner(tiny.config.to_dict(), batch, args.device, args.seed, args.precision)
        same_model_check(preset, tiny, torch_eager, batch, result, lines)
        runners.append(("torch", torch_eager))

        def torch_graphed():
            runner = TorchGraphedRunner(tiny.config.to_dict(), batch, args.device, args.seed, args.precision)
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


def _ms(r, name):
    return "n/a" if name in r["missing"] or f"{name}_median" not in r else f"{r[f'{name}_median'] * 1e3:,.1f}"


def _ratio(r, name, other):
    if any(n in r["missing"] or f"{n}_median" not in r for n in (name, other)):
        return "n/a"
    return f"{r[f'{name}_median'] / r[f'{other}_median']:.2f}x"


def _count(value):
    return "n/a" if value is None else f"{value:,}"


def graphs_table(results, rows, length, tgt_tokens, vs_torch):
    """(header, rows) of the --cuda-graphs table; a figure that was not measured is n/a."""
    header = ["preset", "params", "batch", "tgt tokens", "graphs ms", "eager ms"]
    if vs_torch:
        header += ["torch eager ms", "torch graphs ms", "graphs / torch eager", "graphs / torch graphs"]
    header += ["launches/step"] + (["torch eager launches/step"] if vs_torch else []) + ["graph pool MB"]
    table = []
    for r in results:
        row = [r["preset"], f"{r['params'] / 1e6:.2f} M", f"{rows}x{length}", f"{tgt_tokens:,}",
               _ms(r, "tf_graphs"), _ms(r, "tf")]
        if vs_torch:
            row += [_ms(r, "torch"), _ms(r, "torch_graphs"), _ratio(r, "tf_graphs", "torch"),
                    _ratio(r, "tf_graphs", "torch_graphs")]
        row.append("n/a" if "tf_graphs" in r["missing"] else _count(r.get("tf_graphs_launches")))
        if vs_torch:
            row.append(_count(r.get("torch_launches")))
        row.append("n/a" if "tf_graphs" in r["missing"] else mb(r.get("tf_graphs_pool")))
        table.append(row)
    return header, table


def graphs_notes(results, vs_torch, precision):
    """The lines under the --cuda-graphs table: targets met or not, missing figures, last losses."""
    lines = []
    for r in results:
        preset = r["preset"]
        if vs_torch and preset in GRAPH_TARGETS:
            ratio, target = _ratio(r, "tf_graphs", "torch"), GRAPH_TARGETS[preset]
            verdict = ("not measured" if ratio == "n/a" else
                       "met" if r["tf_graphs_median"] <= target * r["torch_median"] else "not met")
            lines.append(f"{preset}: tinyformer graphs / PyTorch eager {ratio} in {precision}; issue 17's target at "
                         f"most {target}x: {verdict}")
        for name, reason in r["missing"].items():
            lines.append(f"{preset}: {GRAPH_RUNNERS[name]}: not measured: {reason}")
        losses = [f"{label} {r[f'{name}_loss']:.4f}" for name, label in GRAPH_RUNNERS.items()
                  if r.get(f"{name}_loss") is not None and name not in r["missing"]]
        lines.append(f"{preset}: loss at the last timed step, " + ", ".join(losses)
                     + " (the graphed runners also trained on their priming steps)")
    return lines


def print_graphs_report(results, rows, length, batch, args):
    header, table = graphs_table(results, rows, length, batch["tgt_tokens"], args.vs_torch)
    print_table(header, table, args.markdown)
    print()
    print(f"ms: wall time of one whole step (time.perf_counter), median of {args.repeats}; a graphed step includes "
          "copying the batch into the graph's static inputs and reading the loss back.")
    print(f"graphs: tinyformer's GraphedStep (tinyformer train --cuda-graphs on), primed by {PRIMING_STEPS} untimed "
          "steps (the eager one of a new shape and the capture); eager: the same step without graphs.")
    if args.vs_torch:
        print(f"torch graphs: PyTorch's whole-network capture (torch.cuda.graph after "
              f"{TorchGraphedRunner.WARMUP_STEPS} side-stream warm-up steps, Adam(capturable=True"
              + (", fused=True" if args.precision == "fp16" else "") + "), static inputs); torch eager: as without "
              "--cuda-graphs. Ratios: tinyformer graphs median / that median (below 1: tinyformer faster).")
    print("launches/step: kernel nodes of tinyformer's captured graph, child graphs included, as the CUDA driver "
          "counts them (backend.graph_nodes; benchmarks/launch_count.py lists them by family)"
          + ("; torch eager launches/step: CUDA kernels of one eager PyTorch step seen by torch.profiler "
             "(activities CUDA; memory copies and sets not counted), n/a without the profiler" if args.vs_torch
             else "") + ".")
    print("graph pool MB: the private memory pool of tinyformer's graphs (GraphedStep.pool_bytes()).")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", action="append", help="preset name(s), repeatable or comma-separated "
                        "(default: small,base)")
    parser.add_argument("--tokens", type=int, default=4096, help="target tokens per batch (default 4096)")
    parser.add_argument("--length", type=int, default=32, help="padded source/target length (default 32)")
    parser.add_argument("--vocab", type=int, default=8000, help="shared vocabulary size (default 8000)")
    parser.add_argument("--repeats", type=int, default=5, help="timed steps per framework (default 5)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first (default 1)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--vs-torch", action="store_true", help="time the same model in PyTorch alongside")
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's own)")
    parser.add_argument("--order", choices=("interleaved", "blocks"), default="interleaved",
                        help="with --vs-torch: alternate tinyformer and PyTorch steps (default), or run "
                        "all of one framework's steps, then all of the other's")
    parser.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default="fp32",
                        help="tinyformer.engine.amp's precision; PyTorch under torch.autocast of the same type (default fp32)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--markdown", action="store_true", help="print the table as markdown")
    parser.add_argument("--cuda-graphs", action="store_true",
                        help="with --device cuda: time tinyformer's step captured as a CUDA graph beside its eager "
                        "step (and, with --vs-torch, PyTorch eager and PyTorch's own graph of the whole step), with "
                        "the ratios and kernel launches per step (issue 17)")
    args = parser.parse_args(argv)
    if args.tokens < 1 or args.length < 2 or args.repeats < 1 or args.warmup < 0:
        parser.error("--tokens >= 1, --length >= 2, --repeats >= 1 and --warmup >= 0 are required")
    presets = parse_presets(args.preset)

    from tinyformer.engine import backend

    if args.cuda_graphs and (args.device != "cuda" or not backend.is_gpu_available()):
        parser.exit(2, f"{parser.prog}: error: --cuda-graphs " + (
            "needs --device cuda (CUDA graphs capture GPU work)" if args.device != "cuda" else
            "needs CuPy with a usable GPU (tinyformer.engine.backend.is_gpu_available() is false)") + "\n")
    if args.device == "cuda" and not backend.is_gpu_available():
        parser.error("--device cuda needs CuPy with a usable GPU (tinyformer.engine.backend.is_gpu_available())")
    torch = None
    if args.vs_torch:
        try:
            import torch
        except ImportError:
            parser.error("--vs-torch needs PyTorch (pip install '.[bench]')")
        if args.device == "cuda" and not torch.cuda.is_available():
            parser.error("--vs-torch --device cuda needs a CUDA build of PyTorch")
        if args.threads:
            torch.set_num_threads(args.threads)
    args.rss = args.device == "cpu" and rss_probe_available()

    batch = make_batch(args.tokens, args.length, args.vocab, args.seed)
    rows, length = batch["src"].shape

    print("One training step (forward, backward, Adam) per preset")
    print(f"command: {command_line()}")
    print(f"date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"machine: {cpu_model()}, {os.cpu_count()} logical cpus ({cores} usable), {platform.machine()}, "
          f"{platform.system()}")
    versions = f"python {platform.python_version()}, numpy {numpy.__version__}"
    if torch is not None:
        threads = torch.get_num_threads()
        versions += f", torch {torch.__version__} ({threads} intra-op thread{'s' if threads != 1 else ''})"
    if args.device == "cuda":
        import cupy

        versions += f", cupy {cupy.__version__} on {cupy.cuda.runtime.getDeviceProperties(0)['name'].decode()}"
    print(f"versions: {versions}")
    print(f"numpy BLAS: {blas_info()}")
    print(f"precision: {args.precision}" + ("" if args.precision == "fp32" else
          " (fp32 master weights and Adam; products and attention in the half type; PyTorch under torch.autocast"
          + (" with GradScaler)" if args.precision == "fp16" else ")")))
    if args.cuda_graphs:
        order = (", the steps of tinyformer graphs, tinyformer eager" + (", PyTorch eager and PyTorch graphs"
                 if torch is not None else "") + (" interleaved" if args.order == "interleaved" else
                                                  " back to back, one after the other"))
    else:
        order = ("" if torch is None else ", tinyformer and PyTorch steps interleaved" if args.order == "interleaved"
                 else ", all tinyformer steps, then all PyTorch steps")
    print(f"device: {args.device}; median and fastest of {args.repeats} timed steps after {args.warmup} "
          f"warm-up step(s){order}")
    print(f"batch: {rows} sentence pairs, src {rows}x{length} and tgt {rows}x{length} (padded), "
          f"{batch['tgt_tokens']:,} target tokens (non-pad tgt_out positions, fairseq's ntokens; "
          f"{1 - batch['tgt_tokens'] / (rows * length):.0%} padding) and {batch['src_tokens']:,} source tokens; "
          f"shared vocabulary of {args.vocab:,}; label smoothing 0.1, pad ignored; dropout as in the preset")
    print()

    peak = sgemm_peak() if args.device == "cpu" else None
    if peak:
        print(f"sgemm peak (NumPy float32, best of 5 for each of "
              f"{', '.join('x'.join(map(str, s)) for s in PEAK_SHAPES)} as m x k x n): {peak:,.0f} GFLOP/s")
        print()
    notes, results = [], []
    if args.cuda_graphs:
        for preset in presets:
            results.append(measure_graphs(preset, args, batch, notes))
        print_graphs_report(results, rows, length, batch, args)
        for line in notes + graphs_notes(results, args.vs_torch, args.precision):
            print(line)
        if any(r["missing"] for r in results):
            sys.exit(f"{parser.prog}: some figures were not measured (see above)")
        return
    for preset in presets:
        results.append(measure(preset, args, batch, notes))

    header = ["preset", "params", "batch", "tgt tokens", "median ms", "min ms", "tokens/s"]
    header += ["MFU"] if peak else []
    mem_names = ["pool MB"] if args.device == "cuda" else ["traced MB"] + (["RSS MB"] if args.rss else [])
    header += mem_names
    if torch is not None:
        header += ["torch median ms", "torch min ms", "torch tokens/s"] + (["torch MFU"] if peak else [])
        header += ["torch pool MB"] if args.device == "cuda" else (["torch RSS MB"] if args.rss else [])
        header += ["ratio"]
    table = []
    for r in results:
        params = f"{r['params'] / 1e6:.2f} M"
        if torch is not None and r["torch_params"] != r["params"]:
            params += f" / {r['torch_params'] / 1e6:.2f} M"
        row = [r["preset"], params, f"{rows}x{length}", f"{batch['tgt_tokens']:,}",
               f"{r['tf_median'] * 1e3:,.0f}", f"{r['tf_min'] * 1e3:,.0f}",
               f"{batch['tgt_tokens'] / r['tf_median']:,.0f}"]
        mfu = (lambda seconds: f"{r['flops'] / seconds / (peak * 1e9):.1%}") if peak else None
        if mfu:
            row.append(mfu(r["tf_median"]))
        if args.device == "cuda":
            row.append(mb(r.get("tf_mem")))
        else:
            row.append(mb(r.get("tf_traced")))
            if args.rss:
                row.append(mb(r.get("tf_rss")))
        if torch is not None:
            row += [f"{r['torch_median'] * 1e3:,.0f}", f"{r['torch_min'] * 1e3:,.0f}",
                    f"{batch['tgt_tokens'] / r['torch_median']:,.0f}"]
            if mfu:
                row.append(mfu(r["torch_median"]))
            if args.device == "cuda":
                row.append(mb(r.get("torch_mem")))
            elif args.rss:
                row.append(mb(r.get("torch_rss")))
            row.append(f"{r['tf_median'] / r['torch_median']:.2f}x")
        table.append(row)
    print_table(header, table, args.markdown)
    print()
    print("ms: wall time of one whole step (time.perf_counter); tokens/s: target tokens / median step time.")
    if peak:
        print("MFU: model FLOPs (6 · parameters · target tokens + attention, see model_flops) / median step "
              "time / the sgemm peak above.")
    if args.device == "cuda":
        print("pool MB: growth of the GPU memory pool (CuPy's default pool; torch.cuda.max_memory_allocated "
              "for PyTorch) during one untimed step, above what was allocated before it.")
    else:
        print("traced MB: peak of the NumPy/Python memory allocated during one untimed step and live at "
              "once (tracemalloc): activations, gradients, temporaries; parameters and Adam moments "
              "allocated earlier are not in it.")
        if args.rss:
            print("RSS MB: peak resident set during one untimed step minus the resident set before it, "
                  "after malloc_trim (Linux VmHWM reset via /proc/self/clear_refs); the same method for "
                  "both frameworks.")
    if torch is not None:
        print("ratio: tinyformer median / PyTorch median (above 1: tinyformer slower).")
    for r in results:
        line = f"{r['preset']}: loss at the last timed step, tinyformer {r['tf_loss']:.4f}"
        if torch is not None:
            line += f", PyTorch {r['torch_loss']:.4f}"
        notes.append(line)
    for line in notes:
        print(line)


if __name__ == "__main__":
    main()
