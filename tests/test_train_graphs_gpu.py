"""The training step as CUDA graphs on a GPU (issue 17; skipped without a usable GPU).

``tinyformer train --cuda-graphs on`` pads each batch to its bucket (``data.ShapeBuckets``), runs
the first batch of a shape eagerly, captures the second and replays the rest. Its results must
not depend on which path ran: 100 steps with graphs give the losses and final parameters, bit for
bit, of 100 eager steps (``cuda_graphs="off"``) on the same bucketed batches, i.e. the same
kernels on the same shapes; a resume continues exactly; a failed capture falls back to the eager
step with one warning. The eager run on the *unpadded* batches cannot match bit for bit (other
shapes change the matrix products' reductions and dropout's element numbering); without dropout
it matches to rounding (padding is masked).

Runs are shared between tests (``finished_run``): each trains once per session.
"""

import json
import shutil
import warnings

import numpy as np
import pytest

from tinyformer.engine import backend
from tinyformer.translation import checkpoint
from tinyformer.translation.data.batching import ShapeBuckets
from tinyformer.translation.train import TrainConfig, Trainer
from tinyformer.translation.train.builders import build_tokenizer

from test_train import cached_corpus, cached_load_corpus  # noqa: F401 (an autouse fixture)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not backend.is_gpu_available(), reason="no usable CUDA GPU (cupy.is_available() is false)"),
]

STEPS, HALF = 100, 50
_RUNS = {}
_TOKENIZER = {}


def graph_config(save_dir, **overrides):
    values = dict(data="synthetic", preset="tiny", vocab_size=120, max_tokens=512, max_steps=STEPS, warmup_steps=50,
                  save_every=HALF, eval_every=1000, log_every=1, bleu_samples=8, dropout=0.1, device="cuda",
                  threads=1, precision="fp32", cuda_graphs="on", save_dir=str(save_dir))
    values.update(overrides)
    return TrainConfig(**values)


def shared_tokenizer(tmp_path_factory):
    """One joint BPE for every run (each run is handed it in its save_dir, as a resumed run finds its own)."""
    if "path" not in _TOKENIZER:
        folder = tmp_path_factory.mktemp("graph-tokenizer")
        config = graph_config(folder).resolved()
        _TOKENIZER["path"] = build_tokenizer(config, cached_load_corpus(config, "train"), echo=lambda *a: None).path
    return _TOKENIZER["path"]


def bucketed(trainer):
    """Make ``trainer``'s eager steps see the batches its graphs would: padded to their buckets."""
    c = trainer.config
    buckets = ShapeBuckets(c.max_tokens, c.shape_multiple, trainer.model.config.max_len)
    epoch_batches = trainer.train_data.batches
    trainer.train_data.batches = lambda *args, **kwargs: [buckets.pad(b) for b in epoch_batches(*args, **kwargs)]


def train_run(save_dir, tmp_path_factory, resume=False, pad_eager=False, **overrides):
    """Train ``graph_config(save_dir, **overrides)``; returns (trainer, echoed lines)."""
    save_dir.mkdir(parents=True, exist_ok=True)
    if not resume:
        shutil.copy(shared_tokenizer(tmp_path_factory), save_dir / "spm.model")
    lines = []
    trainer = Trainer(graph_config(save_dir, **overrides), resume=resume, echo=lines.append, progress=False)
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
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_graph_replays_give_the_eager_losses_and_parameters_bit_for_bit(tmp_path_factory, precision):
    graphed_dir, graphed, _ = finished_run(tmp_path_factory, f"graphs-{precision}", precision=precision)
    eager_dir, eager, _ = finished_run(tmp_path_factory, f"eager-{precision}", precision=precision,
                                       cuda_graphs="off", pad_eager=True)
    assert eager.graphs is None and graphed.graphs is not None and graphed.graphs.failed is None
    assert graphed.graphs.replays > 0  # the comparison covers replayed steps, not only eager ones
    assert graphed.step == eager.step == STEPS and graphed.skipped_updates == eager.skipped_updates == 0
    assert_same_training(graphed_dir, eager_dir)


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
def test_resume_with_graphs_continues_exactly(tmp_path_factory):
    straight_dir, _, _ = finished_run(tmp_path_factory, "graphs-fp32", precision="fp32")
    resumed_dir = tmp_path_factory.mktemp("graphs-resumed")
    train_run(resumed_dir, tmp_path_factory, max_steps=HALF)
    assert [p.name for p in checkpoint.list_checkpoints(resumed_dir)] == [f"checkpoint_{HALF:07d}.npz"]
    resumed, lines = train_run(resumed_dir, tmp_path_factory, resume=True)
    assert any(f"resumed from checkpoint_{HALF:07d}.npz" in line for line in lines), lines
    assert resumed.step == STEPS and resumed.graphs.num_graphs >= 1
    assert_same_training(resumed_dir, straight_dir)


# ------------------------------------------------------------------ (c) shapes, graphs, pool
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
