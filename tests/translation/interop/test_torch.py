"""PyTorch nn.Transformer state dicts in and out: the mapping (translation/interop/torch_transformer.py), the
PyTorch module of benchmarks/torch_transformer.py that holds the layout, ``tinyformer import torch`` and
``tinyformer export --format torch``. The NumPy tests need no torch; the others skip without it."""

import json
import os
import re
import warnings

import numpy as np
import pytest
from safetensors.numpy import save_file
from scripts import load_script

from tinyformer import cli
from tinyformer.model import nn
from tinyformer.translation.checkpoint import save_checkpoint
from tinyformer.translation.data.special import BOS_ID, EOS_ID, PAD_ID
from tinyformer.translation.data.synthetic import synthetic_pairs
from tinyformer.translation.data.tokenizer import Tokenizer
from tinyformer.translation.decode import greedy_decode
from tinyformer.translation.interop.staging import imported_metadata, write_files_whole
from tinyformer.translation.interop.torch_transformer import (
    POSITIONS, TorchStateError, from_torch_state, to_torch_state, torch_names)
from tinyformer.translation.train import load_model

SMALL = dict(d_model=16, d_ff=32, heads=2, num_layers=2, dropout=0.0, max_len=48)
VOCAB = 30
# The model_configs the round trip covers: the paper's post-LN; stock nn.Transformer's extras with GELU and a
# shallower encoder; pre-LN (final LayerNorms by default) with SiLU and unscaled embeddings.
VARIANTS = {"post-LN": {}, "stock": dict(final_norm=True, init="torch", activation="gelu", encoder_layers=1),
            "pre-LN": dict(norm_first=True, activation="silu", scale_embedding=False)}


class Payload:
    """Not a tensor: unpickled without weights_only, it runs ``os.mkdir(marker)``."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.mkdir, (self.marker,)


@pytest.fixture(scope="module", autouse=True)
def torch_on_one_thread():
    """PyTorch on one thread, as the test's models are tiny: its pool would only wait on a busy machine."""
    try:
        import torch
    except ImportError:
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def benchmarks_module():
    return load_script("benchmarks/torch_transformer.py", "torch_transformer_for_interop")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """(English sentences, German sentences, the joint tokenizer trained on them)."""
    english, german = synthetic_pairs("train", seed=0, sizes={"train": 120, "val": 4, "test": 4})
    tokenizer = Tokenizer.train(english + german, tmp_path_factory.mktemp("tokenizer"), vocab_size=90)
    return english, german, tokenizer


def build_torch(benchmarks_module, config):
    """The benchmarks' PyTorch module of tinyformer ``config`` (pre-LN: its layers switched to norm_first,
    which nn.Transformer's layers read at each call; build_torch_model builds post-LN)."""
    pre_ln = config.norm_first
    model = benchmarks_module.build_torch_model(config.replace(norm_first=False, final_norm=True) if pre_ln else config)
    if pre_ln:
        for layer in [*model.transformer.encoder.layers, *model.transformer.decoder.layers]:
            layer.norm_first = True
    return model


def stirred(model, seed):
    """``model`` with noise on every parameter, so that LayerNorms and biases differ from one another."""
    rng = np.random.default_rng(seed)
    for parameter in model.parameters():
        parameter.data[...] += rng.normal(0, 0.1, parameter.shape).astype(parameter.data.dtype)
    return model


def torch_logits(torch, model, src, tgt_in):
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the encoder's fast path: nested tensors are a prototype
        return model.eval()(torch.from_numpy(src), torch.from_numpy(tgt_in)).numpy()


def relative_difference(ours, theirs):
    return float(np.abs(ours - theirs).max() / np.abs(theirs).max())


def run_cli(capsys, *argv):
    """(exit status, stderr's lines) of ``tinyformer ARGV``."""
    code = cli.main([str(a) for a in argv])
    return code, capsys.readouterr().err.splitlines()


# ---------------------------------------------------------------------------- the mapping, NumPy only
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_parameter_has_one_place_and_comes_back_identical(variant):
    tiny = stirred(nn.Transformer(src_vocab_size=VOCAB, seed=1, **SMALL, **VARIANTS[variant]), 1)
    state = tiny.state_dict()
    names = torch_names(tiny.config)
    assert sorted(part for parts in names.values() for part in parts) == sorted(state)
    tensors = to_torch_state(state, tiny.config)
    assert set(tensors) == set(names) | {POSITIONS}
    assert tensors["transformer.encoder.layers.0.self_attn.in_proj_weight"].shape == (48, 16)  # Q, K, V packed
    assert ("transformer.decoder.norm.weight" in tensors) == (variant != "post-LN")
    back = from_torch_state(tensors, tiny.config, "x.pt")
    assert back.keys() == state.keys()
    for name in state:
        np.testing.assert_array_equal(back[name], state[name], err_msg=name)
        assert back[name].dtype == state[name].dtype


@pytest.mark.parametrize("field, value", [("positional", "learned"), ("positional", "sinusoid_split"),
                                          ("tgt_vocab_size", VOCAB + 1), ("logits_bias", True)])
def test_what_the_layout_has_no_tensor_for_is_refused_naming_the_field(field, value):
    tiny = nn.Transformer(src_vocab_size=VOCAB, seed=1, **SMALL, **{field: value})
    for convert in (lambda: to_torch_state(tiny.state_dict(), tiny.config),
                    lambda: from_torch_state({}, tiny.config, "x.pt")):
        with pytest.raises(TorchStateError, match=f"{field}={value!r} cannot be") as caught:
            convert()
        assert "\n" not in str(caught.value)


LAYER = "transformer.encoder.layers.0."


@pytest.mark.parametrize("change, message", [
    (lambda t: t.pop(f"{LAYER}linear1.bias"), f"x.pt: tensor {LAYER}linear1.bias is missing$"),
    (lambda t: t.__setitem__(f"{LAYER}linear1.bais", t.pop(f"{LAYER}linear1.bias")),
     f"tensor {LAYER}linear1.bias is missing \\(and {LAYER}linear1.bais is not part of the layout\\)"),
    (lambda t: t.__setitem__("transformer.encoder.norm.weight", np.ones(16, np.float32)),
     "tensor transformer.encoder.norm.weight is not part of .* no final LayerNorms: .* final_norm: true"),
    (lambda t: t.__setitem__(f"{LAYER}self_attn.in_proj_weight", np.zeros((32, 16), np.float32)),
     f"tensor {LAYER}self_attn.in_proj_weight has shape \\(32, 16\\), but the model_config makes it \\(48, 16\\)"),
    (lambda t: t["embed.weight"].__setitem__((0, 0), np.nan), "tensor embed.weight holds NaN or Inf"),
    (lambda t: t.__setitem__("embed.weight", t["embed.weight"].astype(np.int32)),
     "tensor embed.weight has dtype int32"),
    (lambda t: t.__setitem__(POSITIONS, t[POSITIONS] + 0.5), "tensor pe is not tinyformer's sinusoids"),
    (lambda t: t.__setitem__(POSITIONS, t[POSITIONS][:10]), "tensor pe has shape \\(10, 16\\), but the model_config"),
])
def test_each_wrong_tensor_is_one_line_naming_it(change, message):
    tiny = nn.Transformer(src_vocab_size=VOCAB, seed=1, **SMALL)
    tensors = to_torch_state(tiny.state_dict(), tiny.config)
    change(tensors)
    with pytest.raises(TorchStateError, match=message) as caught:
        from_torch_state(tensors, tiny.config, "x.pt")
    assert "\n" not in str(caught.value)


def test_positions_are_optional_on_the_way_in():
    tiny = nn.Transformer(src_vocab_size=VOCAB, seed=1, **SMALL)
    tensors = to_torch_state(tiny.state_dict(), tiny.config)
    del tensors[POSITIONS]
    assert from_torch_state(tensors, tiny.config, "x.pt").keys() == tiny.state_dict().keys()


# ---------------------------------------------------------------------------- with PyTorch's module
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_the_benchmarks_module_holds_the_layout_and_computes_the_same_logits(benchmarks_module, variant):
    torch = pytest.importorskip("torch")
    tiny = stirred(nn.Transformer(src_vocab_size=VOCAB, seed=2, **SMALL, **VARIANTS[variant]), 0)
    tensors = to_torch_state(tiny.state_dict(), tiny.config)
    torch.manual_seed(0)
    model = build_torch(benchmarks_module, tiny.config)
    assert list(model.state_dict()) == list(tensors)  # exactly the documented names, in PyTorch's order
    model.load_state_dict({name: torch.from_numpy(value) for name, value in tensors.items()}, strict=True)
    src = np.array([[5, 6, 7, 8, 9, EOS_ID], [10, 11, EOS_ID, PAD_ID, PAD_ID, PAD_ID]])
    tgt_in = np.array([[BOS_ID, 12, 13, 14, 15], [BOS_ID, 16, 17, PAD_ID, PAD_ID]])
    theirs = torch_logits(torch, model, src, tgt_in)
    ours = tiny.eval()(src, tgt_in).data
    assert relative_difference(ours[0], theirs[0]) <= 1e-5
    assert relative_difference(ours[1, :3], theirs[1, :3]) <= 1e-5  # the padded row's real positions
    back = from_torch_state(model.state_dict(), tiny.config, "the module")
    for name, value in tiny.state_dict().items():
        np.testing.assert_array_equal(back[name], value, err_msg=name)


def test_the_benchmarks_module_refuses_what_the_layout_cannot_hold(benchmarks_module):
    pytest.importorskip("torch")
    config = nn.Transformer(src_vocab_size=VOCAB, seed=2, positional="learned", **SMALL).config
    with pytest.raises(TorchStateError, match="build_torch_model: positional='learned'"):
        benchmarks_module.build_torch_model(config)


# ---------------------------------------------------------------------------- trained in PyTorch, through the CLI
@pytest.fixture(scope="module")
def trained_in_torch(benchmarks_module, corpus, tmp_path_factory):
    """A model trained 12 steps in PyTorch on the tokenizer's corpus, saved as model.pt with model.json
    beside it: (folder, the PyTorch model, its config)."""
    torch = pytest.importorskip("torch")
    english, german, tokenizer = corpus
    config = nn.TransformerConfig(src_vocab_size=len(tokenizer), **SMALL, final_norm=True).to_dict()
    torch.manual_seed(0)
    model = benchmarks_module.build_torch_model(config)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    pairs = [(tokenizer.encode(e) + [EOS_ID], [BOS_ID] + tokenizer.encode(g) + [EOS_ID])
             for e, g in zip(english, german)]
    for step in range(12):
        batch = pairs[step * 8:(step + 1) * 8]
        src = torch.nn.utils.rnn.pad_sequence([torch.tensor(s) for s, _ in batch], batch_first=True)
        tgt = torch.nn.utils.rnn.pad_sequence([torch.tensor(t) for _, t in batch], batch_first=True)
        logits = model.train()(src, tgt[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, len(tokenizer)), tgt[:, 1:].reshape(-1),
                                                 ignore_index=PAD_ID)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    folder = tmp_path_factory.mktemp("trained_in_torch")
    torch.save(model.state_dict(), folder / "model.pt")
    (folder / "model.json").write_text(json.dumps(config), encoding="utf-8")
    return folder, model.eval(), config


def test_a_model_trained_in_pytorch_is_imported_translates_and_computes_torchs_logits(
        trained_in_torch, corpus, tmp_path, capsys):
    torch = pytest.importorskip("torch")
    folder, model, config = trained_in_torch
    english, _, tokenizer = corpus
    run = tmp_path / "run"
    code, err = run_cli(capsys, "import", "torch", folder / "model.pt", "--model-config", folder / "model.json",
                        "--tokenizer", tokenizer.path, "--output", run)
    assert (code, err) == (0, [])
    lines = tmp_path / "english.txt"
    lines.write_text("\n".join(english[:3]) + "\n", encoding="utf-8")
    code, err = run_cli(capsys, "translate", "--checkpoint", run, "--beam", "1", "--input", lines,
                        "--output", tmp_path / "german.txt")
    assert (code, err) == (0, [])
    assert len((tmp_path / "german.txt").read_text(encoding="utf-8").splitlines()) == 3
    tiny, tokenizer_read, _ = load_model(run)
    assert tokenizer_read.sha256 == tokenizer.sha256
    src = np.array([tokenizer.encode(english[0]) + [EOS_ID]])
    hypothesis = greedy_decode(tiny, src, max_len_b=8)[0]
    tgt_in = np.array([[BOS_ID] + hypothesis])
    theirs = torch_logits(torch, model, src, tgt_in)
    assert relative_difference(tiny(src, tgt_in).data, theirs) <= 1e-5
    theirs[..., [PAD_ID, BOS_ID]] = -np.inf  # what tinyformer's search never chooses
    assert theirs[0, :len(hypothesis)].argmax(axis=-1).tolist() == hypothesis  # PyTorch's greedy choices


def test_export_writes_the_state_dict_back_and_import_reads_it(trained_in_torch, corpus, tmp_path, capsys):
    torch = pytest.importorskip("torch")
    folder, model, config = trained_in_torch
    tokenizer = corpus[2]
    run = tmp_path / "run"
    assert run_cli(capsys, "import", "torch", folder / "model.pt", "--tokenizer", tokenizer.path,
                   "--output", run)[0] == 0  # model.json beside it, by default
    code, err = run_cli(capsys, "export", run, "--format", "torch", "--output", tmp_path / "back.pt")
    assert (code, err) == (0, [])
    saved = torch.load(tmp_path / "back.pt", weights_only=True)
    original = model.state_dict()
    assert list(saved) == list(original)
    for name, value in original.items():
        assert torch.equal(saved[name], value), name
    assert json.loads((tmp_path / "back.json").read_text(encoding="utf-8")) == config
    assert run_cli(capsys, "import", "torch", tmp_path / "back.pt", "--tokenizer", tokenizer.path,
                   "--output", tmp_path / "again")[0] == 0


# ---------------------------------------------------------------------------- refusals: one line, nothing written
def write_case(case, folder, tokenizer):
    """(weights file, model_config file) of a bad import ``case``."""
    config = nn.TransformerConfig(src_vocab_size=len(tokenizer), **SMALL)
    tensors = to_torch_state(nn.Transformer.from_config(config.replace(seed=4)).state_dict(), config)
    if case == "wrong name":
        tensors[f"{LAYER}linear1.bais"] = tensors.pop(f"{LAYER}linear1.bias")
    elif case == "wrong shape":
        tensors[f"{LAYER}linear2.weight"] = tensors[f"{LAYER}linear2.weight"][:, :-1].copy()
    elif case == "vocabulary mismatch":
        config = config.replace(src_vocab_size=len(tokenizer) + 1)
    elif case == "learned positions":
        config = config.replace(positional="learned")
    weights = folder / "model.safetensors"
    if case in ("object in the pickle", "not a state dict"):
        torch = pytest.importorskip("torch")
        weights = folder / "model.pt"
        extra = Payload(folder / "unpickled") if case == "object in the pickle" else 12
        torch.save({**{k: torch.from_numpy(v) for k, v in tensors.items()}, "extra": extra}, weights)
    else:
        save_file(tensors, str(weights))
    (folder / "model.json").write_text(json.dumps(config.to_dict()), encoding="utf-8")
    return weights, folder / "model.json"


@pytest.mark.parametrize("case, message", [
    ("object in the pickle", "model.pt is not plain tensors \\(read with weights_only=True, running no code"),
    ("not a state dict", "model.pt: entry 'extra' is a int, not a tensor"),
    ("wrong name", f"model.safetensors: tensor {LAYER}linear1.bias is missing \\(and {LAYER}linear1.bais"),
    ("wrong shape", f"tensor {LAYER}linear2.weight has shape \\(16, 31\\), but the model_config makes it \\(16, 32\\)"),
    ("vocabulary mismatch", "--tokenizer .* has 90 pieces, but .*model.json's src_vocab_size is 91"),
    ("learned positions", "model.json: positional='learned' cannot be a PyTorch nn.Transformer state dict"),
])
def test_a_bad_import_is_one_line_and_writes_nothing(case, message, corpus, tmp_path, capsys):
    tokenizer = corpus[2]
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    weights, model_config = write_case(case, inputs, tokenizer)
    code, err = run_cli(capsys, "import", "torch", weights, "--model-config", model_config,
                        "--tokenizer", tokenizer.path, "--output", tmp_path / "run")
    assert code == 1 and len(err) == 1, err
    assert re.search(message, err[0]), err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["inputs"]  # no run, no staging folder
    assert not (tmp_path / "inputs" / "unpickled").exists()  # the pickle's code did not run


def test_an_import_that_fails_while_writing_leaves_nothing(corpus, tmp_path, capsys, monkeypatch):
    from tinyformer.translation.interop import torch_runs

    def full_disk(*args):
        raise OSError("No space left on device")

    monkeypatch.setattr(torch_runs, "save_checkpoint", full_disk)
    tokenizer = corpus[2]
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    weights, model_config = write_case("good", inputs, tokenizer)
    code, err = run_cli(capsys, "import", "torch", weights, "--model-config", model_config,
                        "--tokenizer", tokenizer.path, "--output", tmp_path / "run")
    assert code == 1 and err == ["tinyformer import: error: No space left on device"], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["inputs"]


def test_an_export_writes_both_files_or_neither(tmp_path):
    def broken(path):
        raise OSError("No space left on device")

    with pytest.raises(OSError, match="No space"):
        write_files_whole({tmp_path / "a.pt": lambda path: path.write_bytes(b"weights"), tmp_path / "a.json": broken})
    assert list(tmp_path.iterdir()) == []
    written = write_files_whole({tmp_path / "a.pt": lambda path: path.write_bytes(b"weights"),
                                 tmp_path / "a.json": lambda path: path.write_text("{}")})
    assert written == [tmp_path / "a.pt", tmp_path / "a.json"] and sorted(p.name for p in tmp_path.iterdir()) == [
        "a.json", "a.pt"]


def test_export_refuses_what_torch_cannot_hold_and_an_existing_file(corpus, tmp_path, capsys):
    pytest.importorskip("torch")  # a .pt file is written by torch.save
    tokenizer = corpus[2]
    for name, extras in (("learned", {"positional": "learned"}), ("plain", {})):
        config = nn.TransformerConfig(src_vocab_size=len(tokenizer), **SMALL, **extras)
        (tmp_path / name).mkdir()
        save_checkpoint(tmp_path / name / "checkpoint_0000000.npz", nn.Transformer.from_config(config).state_dict(),
                        imported_metadata(config, tokenizer, "spm.model", {"kind": "test"}))
    code, err = run_cli(capsys, "export", tmp_path / "learned", "--format", "torch", "--output", tmp_path / "out.pt")
    assert code == 1 and len(err) == 1 and "positional='learned' cannot be" in err[0], err
    (tmp_path / "taken.json").write_text("{}", encoding="utf-8")
    code, err = run_cli(capsys, "export", tmp_path / "plain", "--format", "torch", "--output", tmp_path / "taken.pt")
    assert code == 1 and err == [f"tinyformer export: error: --output: {tmp_path / 'taken.json'} already exists: "
                                 "choose a new name"], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["learned", "plain", "taken.json"]
