"""PyTorch's training step on the same model, batch and weights as tinyformer's: eager
(``TorchRunner``) and captured whole as one CUDA graph (``TorchGraphedRunner``); and the kernels of a
PyTorch step, counted with ``torch.profiler``. PyTorch (the ``bench`` extra) is imported only when
a runner is built."""

from step_batch import LABEL_SMOOTHING, PAD
from step_device import in_eval_mode, loss_value, synchronize
from torch_transformer import build_torch_model


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
        return loss_value(loss, self.device)

    def eval_loss(self, rows):
        # Grad stays enabled so that PyTorch takes its ordinary path, not the inference fast path.
        with in_eval_mode(self.model), self._autocast():
            loss = self._loss(self.model(self.src[:rows], self.tgt_in[:rows]), self.tgt_out[:rows])
        return loss.item()


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
