"""tinyformer.study.course: the exercises, the checker that names mistakes, the swap into a real model, the CLI.

Every reference solution (tests/study_solutions: what a reader writes from `def backward(` on, put
into the file `study start` writes) passes; typical mistakes, each a small edit of a reference solution, fail with the
message naming them; a right backward swapped into a model gives tinyformer's own gradients and a
falling loss, a wrong one is really used, and tinyformer's own methods are back afterwards.
"""

import types
from pathlib import Path

import numpy
import pytest

from tinyformer import cli
from tinyformer.model import nn
from tinyformer.engine import functional as F
from tinyformer.study.course import EXERCISES, check, load, swap
from tinyformer.study.course.cases import prepared

BACKWARDS = Path(__file__).resolve().parents[1] / "study_solutions"
BY_FILENAME = {exercise.filename: exercise for exercise in EXERCISES}


def solution_text(filename):
    """Reference solution ``filename``: the file `study start` writes, its unwritten backward (7:
    forward) replaced by tests/study_solutions/``filename`` (a ``def backward(`` and what follows)."""
    marker = f"def {BY_FILENAME[filename].writes}("
    given, found, _ = BY_FILENAME[filename].template().partition(marker)
    _, written, body = (BACKWARDS / filename).read_text(encoding="utf-8").partition(marker)
    assert found and written, f"{filename}: no {marker} in the template or the solution"
    return given + written + body


def solution(tmp_path, filename):
    """Reference solution ``filename`` written to ``tmp_path``; its path."""
    path = tmp_path / filename
    path.write_text(solution_text(filename), encoding="utf-8")
    return path


def edited(tmp_path, solution, old, new):
    """A copy of a reference solution with ``old`` (found exactly once) replaced by ``new``."""
    text = solution_text(solution)
    assert text.count(old) == 1, f"{old!r} is not found once in {solution}"
    path = tmp_path / solution
    path.write_text(text.replace(old, new), encoding="utf-8")
    return path


# ---------------------------------------------------------------------------- the checker
@pytest.mark.parametrize("exercise", EXERCISES, ids=lambda e: e.filename)
def test_every_reference_solution_passes(exercise, tmp_path):
    report = check(solution(tmp_path, exercise.filename))
    text = "\n".join(report.lines())
    assert report.passed, text
    assert f"exercise {exercise.number}, {exercise.title}: right." in text
    assert report.differences[0] < 1e-12 and report.differences[1] < 1e-6


@pytest.mark.parametrize("exercise", EXERCISES, ids=lambda e: e.filename)
def test_a_reference_solution_is_the_template_with_backward_written(exercise):
    template, text, marker = exercise.template(), solution_text(exercise.filename), f"def {exercise.writes}("
    given, _, unwritten = template.partition(marker)
    assert text.startswith(given) and template.count(marker) == text.count(marker) == 1
    assert unwritten.count("raise NotImplementedError") == 1 and "raise NotImplementedError" not in text


@pytest.mark.parametrize("number", [e.number for e in EXERCISES if e.number <= 6])  # 7, 8: study/test_course_flash.py
def test_the_op_and_central_differences_agree_on_every_case(number):
    """The two answers the checker holds a backward to (prepared refuses to disagree), over the
    edge cases the exercise promises."""
    cases = prepared(number)
    tags = set().union(*(c.tags for c in cases))
    promised = {2: {"length 1", "batch 1", "masked entries"}, 3: {"one feature", "batch 1"},
                4: {"causal", "padding", "fully masked row", "length 1", "batch 1", "len_q ≠ len_k"},
                5: {"padding", "an all-padding row", "every target padding", "length 1", "batch 1"},
                6: {"causal", "padding", "fully masked row", "length 1", "batch 1"}}.get(number, {"batch 1"})
    assert promised <= tags
    for case in cases:
        for name, expected in case.expected.items():
            assert numpy.allclose(case.numeric[name], expected, rtol=1e-4, atol=1e-6), (case.name, name)


MISTAKES = {
    "chain rule, not accumulated": (
        "01_chain_rule.py", "dx = dz @ w.T + dy * h", "dx = dz @ w.T",
        ["dx is wrong in every case", "gradients not accumulated for x", "only the path through z"]),
    "chain rule, missing transpose": (
        "01_chain_rule.py", "dw = x.T @ dz", "dw = dz.T @ x",
        ["dW is wrong", "the right numbers transposed: a missing (or extra) transpose"]),
    "chain rule, a sign lost": (
        "01_chain_rule.py", "db = dz.sum(axis=0)", "db = -dz.sum(axis=0)",
        ["db is wrong in every case (4 of 4)", "−1 times the right answer: the wrong sign"]),
    "chain rule, rows in the wrong order": (
        "01_chain_rule.py", "return dx, dw, db", "return dx[::-1], dw, db",
        ["dx is wrong in every case but those for batch 1 (3 of 4)", "the right numbers at the wrong positions"]),
    "softmax, Σ dp for Σ dp·p": (
        "02_softmax.py", "(dp * p).sum(axis=-1, keepdims=True)", "dp.sum(axis=-1, keepdims=True)",
        ["dx is wrong", "the wrong row sum in softmax's backward: Σ dp where it is Σ dp·p"]),
    "softmax, sum over the wrong axis": (
        "02_softmax.py", "(dp * p).sum(axis=-1, keepdims=True)", "(dp * p).sum(axis=0, keepdims=True)",
        ["the wrong row sum in softmax's backward: summed over the wrong axis"]),
    "softmax, a wrong row sum of another kind": (
        "02_softmax.py", "(dp * p).sum(axis=-1, keepdims=True)", "0.5 * (dp * p).sum(axis=-1, keepdims=True)",
        ["p times one number per row, so the number subtracted from each row of dp is wrong"]),
    "layer norm, the path through σ² missing": (
        "03_layer_norm.py", " - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True))", ")",
        ["dx is wrong", "the path through σ² is missing"]),
    "attention, forgetting the 1/√d_k": (
        "04_attention.py", "    dq = ds @ k * scale\n    dk = ds.swapaxes(-1, -2) @ q * scale",
        "    dq = ds @ k\n    dk = ds.swapaxes(-1, -2) @ q",
        ["dQ and dK are wrong in every case but those for length 1", "√d_k times the right answer: forgetting the 1/√d_k",
         "dV is right"]),
    "attention, missing transpose": (
        "04_attention.py", "dv = p.swapaxes(-1, -2) @ d_out", "dv = p @ d_out",
        ["(`dv = p @ d_out`) raised ValueError in case \"padding, len_q 3 ≠ len_k 5\"", "a missing transpose?",
         "what it looks like: a missing transpose: dV = P·dO, where it is Pᵀ·dO"]),
    "attention, the mask applied to P instead of S": (
        "04_attention.py",
        "    s = numpy.where(keep_mask(mask, causal, q.shape[-2], k.shape[-2]), s, -numpy.inf)\n    p = softmax(s)\n    dv",
        "    p = softmax(s) * keep_mask(mask, causal, q.shape[-2], k.shape[-2])\n    dv",
        ["there only in the rows with a hidden key", "the mask applied to P instead of S"]),
    "attention, wrong only where the causal mask hides keys": (
        "04_attention.py",
        "    s = numpy.where(keep_mask(mask, causal, q.shape[-2], k.shape[-2]), s, -numpy.inf)\n    p = softmax(s)\n    dv",
        "    s = numpy.where(keep_mask(mask, False, q.shape[-2], k.shape[-2]), s, -numpy.inf)\n    p = softmax(s)\n    dv",
        ["dQ is wrong only with a causal mask (3 of 7 cases", "there only in the rows the causal mask hides keys from",
         "the causal mask left out of backward"]),
    "attention, nan in a fully masked row": (
        "04_attention.py", "    p = softmax(s)\n    dv",
        "    e = numpy.exp(s - s.max(axis=-1, keepdims=True))\n    p = e / e.sum(axis=-1, keepdims=True)\n    dv",
        ["only when a row is fully masked (1 of 7 cases", "there only in the fully masked rows",
         "nan from a query that sees no key"]),
    "cross entropy, smoothing mass given to padding": (
        "05_cross_entropy.py", "return d_loss * kept * (p - smoothed_target(target, vocab, smoothing)) / count",
        "q = smoothed_target(target, vocab, smoothing) * kept + (~kept) * smoothing / vocab\n"
        "    return d_loss * (p * kept - q) / count",
        ["there only in the padding positions, where the right answer is 0", "smoothing mass given to padding"]),
    "cross entropy, the mean over every position": (
        "05_cross_entropy.py", "count = max(int(kept.sum()), 1)", "count = kept.size",
        ["divided by every position, padding included"]),
    "multi-head attention, forgetting the 1/√d_k": (
        "06_multi_head_attention.py", "    dq = ds @ k * scale\n    dk = ds.swapaxes(-1, -2) @ q * scale",
        "    dq = ds @ k\n    dk = ds.swapaxes(-1, -2) @ q",
        ["dquery, dkey, dW_Q, db_Q and dW_K are wrong", "forgetting the 1/√d_k"]),
    "multi-head attention, heads merged back by a reshape": (
        "06_multi_head_attention.py", 'd_heads = split_heads(linear_backward(merged, params["w_o"], d_out, "o"), heads)',
        'd_heads = linear_backward(merged, params["w_o"], d_out, "o").reshape(p.shape[0], heads, p.shape[2], -1)',
        ["the heads' gradient split back by a reshape alone"]),
}


@pytest.mark.parametrize("mistake", MISTAKES)
def test_a_typical_mistake_fails_with_the_message_naming_it(mistake, tmp_path):
    solution, old, new, phrases = MISTAKES[mistake]
    report = check(edited(tmp_path, solution, old, new))
    text = "\n".join(report.lines())
    assert not report.passed
    assert "not right yet" in text
    for phrase in phrases:
        assert phrase in text, f"{phrase!r} not in:\n{text}"
    assert "largest error" in text and "expected" in text and "central differences" in text and "got" in text


def test_a_wrong_shape_and_a_wrong_count_are_one_line_each(tmp_path):
    shape = check(edited(tmp_path, "03_layer_norm.py", "return dx, (dy * xhat).sum(axis=rows), dy.sum(axis=rows)",
                         "return dx, (dy * xhat).sum(axis=0), dy.sum(axis=rows)"))
    assert not shape.passed
    assert shape.lines()[0].endswith("dgain is wrong; dx and dbias are right where they could be compared.")
    assert 'dgain has shape (3, 4) in case "(2, 3, 4): leading axes"; it must be (4,)' in shape.lines()[1]
    count = check(edited(tmp_path, "01_chain_rule.py", "return dx, dw, db", "return dx, dw"))
    assert not count.passed
    assert count.lines()[1].strip() == "backward returned 2 values; exercise 1 returns 3: (dx, dW, db)"


def test_a_file_whose_forward_was_changed_cannot_be_checked(tmp_path):
    from tinyformer.study.course import ExerciseFileError

    path = edited(tmp_path, "02_softmax.py", "return e / e.sum(axis=-1, keepdims=True)", "return e")
    with pytest.raises(ExerciseFileError, match="its forward no longer computes exercise 2's"):
        check(path)


# ---------------------------------------------------------------------------- the swap into a model
def _swapped_classes():
    """The class attributes a swap may replace (3 and 5), and MultiHeadAttention's, as they are now."""
    from tinyformer.engine.functional import CrossEntropy, LayerNorm, ScaledDotProductAttention

    return {(c.__name__, n): c.__dict__.get(n) for c in (ScaledDotProductAttention, LayerNorm, CrossEntropy)
            for n in ("forward_reference", "backward_reference")} | {
                ("MultiHeadAttention", name): nn.MultiHeadAttention.__dict__.get(name)
                for name in ("forward", "attention", "probe")}


def _tiny_model():
    """A `tiny` Transformer in eval mode (no dropout)."""
    return nn.Transformer.from_preset("tiny", vocab_size=23, pad_id=0, max_len=32, seed=3).eval()


def _own_attention(model):
    """Whether every MultiHeadAttention of ``model`` calls tinyformer's own attention."""
    return all(type(m.attention) is nn.probe.Attention for m in model.modules() if isinstance(m, nn.MultiHeadAttention))


def _model_gradients(model, packed=False):
    """The parameter gradients of ``model`` (`tiny`, eval mode: no dropout) on one padded batch, or
    on its packed rows (the CPU trainer's layout, ``batch_loss``)."""
    model.zero_grad()
    src = numpy.array([[5, 6, 7, 8, 2], [9, 10, 2, 0, 0]])
    tgt_in = numpy.array([[1, 11, 12, 13], [1, 14, 15, 0]])
    tgt_out = numpy.array([[11, 12, 13, 2], [14, 15, 2, 0]])
    if packed:
        counted = tgt_out != 0
        logits, targets = model(src, tgt_in, positions=counted, packed=True), tgt_out[counted]
    else:
        logits, targets = model(src, tgt_in), tgt_out
    loss = F.cross_entropy(logits, targets, 0.1, ignore_index=0, reduction="sum")
    loss.backward()
    return [p.grad.copy() for p in model.parameters()]


def _doubled(module, name="backward"):
    """The reader's module with a wrong ``name`` (backward; 7: forward): twice the right answers."""
    def doubled(*args):
        grads = getattr(module, name)(*args)
        if isinstance(grads, dict):
            return {k: 2 * v for k, v in grads.items()}
        return tuple(2 * g for g in grads) if isinstance(grads, tuple) else 2 * grads

    return types.SimpleNamespace(**{**vars(module), name: doubled})


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("number", [2, 3, 4, 5, 6, 7, 8])
def test_a_swapped_backward_is_the_one_the_model_uses_and_is_put_back(number, packed, tmp_path):
    before, model = _swapped_classes(), _tiny_model()
    own = _model_gradients(model, packed)
    module, _ = load(solution(tmp_path, EXERCISES[number - 1].filename))
    with swap.swapped_in(number, module, model) as right:
        readers = _model_gradients(model, packed)
    assert right.calls > 0
    for mine, theirs in zip(readers, own):
        numpy.testing.assert_allclose(mine, theirs, rtol=2e-4, atol=2e-6)
    with swap.swapped_in(number, _doubled(module, EXERCISES[number - 1].writes), model) as wrong:
        doubled = _model_gradients(model, packed)
    assert wrong.calls > 0
    assert any(not numpy.allclose(d, o, rtol=1e-2, atol=1e-5) for d, o in zip(doubled, own))
    assert _swapped_classes() == before and _own_attention(model)


@pytest.mark.parametrize("packed", [False, True])
def test_a_swapped_in_attention_forward_adds_its_own_output_bias_and_the_residual_adds_no_other(packed, tmp_path):
    """Post-LN, MultiHeadAttention's own forward leaves W_O's bias to the residual node; the reader's
    forward (exercise 6) adds it itself and says nothing, so the residual adds none: the same values."""
    model = nn.Transformer.from_preset("tiny", vocab_size=23, pad_id=0, max_len=32, seed=3)
    model.eval()
    rng = numpy.random.default_rng(5)
    for module in model.modules():  # output biases that show when added twice or never (they start at 0)
        if isinstance(module, nn.MultiHeadAttention):
            module.w_o.bias.data[...] = rng.standard_normal(module.w_o.bias.shape).astype(numpy.float32)
    src, tgt_in = numpy.array([[5, 6, 7, 8, 2], [9, 10, 2, 0, 0]]), numpy.array([[1, 11, 12, 13], [1, 14, 15, 0]])
    counted = tgt_in != 0
    run = (lambda: model(src, tgt_in, positions=counted, packed=True)) if packed else (lambda: model(src, tgt_in))
    own = run().data
    module, _ = load(solution(tmp_path, "06_multi_head_attention.py"))
    with swap.swapped_in(6, module, model) as swapped:
        theirs = run()
        theirs.sum().backward()
    assert swapped.calls == sum(isinstance(m, nn.MultiHeadAttention) for m in model.modules())  # the reader's, each
    numpy.testing.assert_allclose(theirs.data, own, rtol=1e-4, atol=1e-5)


def test_the_swap_is_undone_after_an_error_or_ctrl_c(tmp_path):
    before, model = _swapped_classes(), _tiny_model()
    for number, filename in ((4, "04_attention.py"), (3, "03_layer_norm.py")):
        module, _ = load(solution(tmp_path, filename))
        for stop in (KeyboardInterrupt, RuntimeError):
            with pytest.raises(stop):
                with swap.swapped_in(number, module, model):
                    assert _swapped_classes() != before or not _own_attention(model)
                    raise stop()
            assert _swapped_classes() == before and _own_attention(model)
    with pytest.raises(swap.NoModelOp):
        with swap.swapped_in(1, load(solution(tmp_path, "01_chain_rule.py"))[0], model):
            pass


def test_the_course_swaps_implement_the_attention_contract_the_model_calls():
    """Exercises 2, 4, 6, 7 and 8 reach the model through nn.probe.Attention only: each swap's
    ``heads`` has the signature of the one MultiHeadAttention calls, and ``module`` the (mha, call)."""
    import inspect

    from tinyformer.model.nn.probe import Attention

    def subclasses(cls):
        return [cls] + [s for sub in cls.__subclasses__() for s in subclasses(sub)]

    readers = {c.__name__: c for c in subclasses(Attention) if c.__module__.startswith("tinyformer.study.")}
    assert {"ReaderSoftmax", "ReaderAttentionBackward", "ReaderMultiHead", "ReaderTiledForward",
            "ReaderTiledBackward"} <= set(readers)
    for cls in readers.values():
        reader = cls(None, swap.Swap(0))
        assert inspect.signature(reader.heads) == inspect.signature(Attention.heads), cls.__name__
        if cls.module is not None:
            assert list(inspect.signature(reader.module).parameters) == ["mha", "call"], cls.__name__


@pytest.mark.parametrize("number", [4, 6])  # 6: the whole module, on the trainer's packed rows
def test_a_right_backward_trains_a_tiny_model_with_a_falling_loss(number, tmp_path):
    before = _swapped_classes()
    module, _ = load(solution(tmp_path, EXERCISES[number - 1].filename))
    shown = []
    proof = swap.train(number, module, steps=40, max_tokens=256, echo=shown.append)
    assert proof.falling and proof.last < proof.first - 1.0, proof.losses
    assert proof.calls == 40 * 6  # 2 encoder self-attentions + 2 × (decoder self + cross) per step
    assert [line.split(":")[0].strip() for line in shown] == ["step  1", "step  8", "step 16", "step 24", "step 32",
                                                              "step 40"]
    assert _swapped_classes() == before


# ---------------------------------------------------------------------------- the command line
def run(argv, capsys):
    try:
        code = cli.main(argv)
    except SystemExit as exit_:
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out, err


def test_study_lists_the_eight_exercises_in_order(capsys):
    code, out, _ = run(["study"], capsys)
    assert code == 0
    listed = [line.split()[0] for line in out.splitlines() if line.startswith("  ") and line.split()[0].isdigit()]
    assert listed == ["1", "2", "3", "4", "5", "6", "7", "8"]
    for e in EXERCISES:
        assert f"  {e.number}  {e.title}" in out and e.summary in out
    assert "tinyformer study start N [DIR]" in out and "tinyformer study check FILE" in out


def test_start_writes_an_exercise_that_check_calls_unwritten_and_is_never_overwritten(tmp_path, capsys):
    folder = tmp_path / "course"
    code, out, _ = run(["study", "start", "2", str(folder)], capsys)
    path = folder / "02_softmax.py"
    assert code == 0 and path.is_file()
    assert f"wrote {path}" in out and f"tinyformer study check {path}" in out
    assert "raise NotImplementedError" in path.read_text(encoding="utf-8")
    assert [p.name for p in folder.iterdir()] == ["02_softmax.py"]  # no temporary file left
    code, out, _ = run(["study", "check", str(path)], capsys)
    assert code == 1
    assert out.strip() == (f"{path}: exercise 2, softmax: backward is not written yet (it raises NotImplementedError): "
                           f"write it, then run `tinyformer study check {path}` again")
    path.write_text("# mine\n", encoding="utf-8")
    code, _, err = run(["study", "start", "2", str(folder)], capsys)
    assert code == 1 and len(err.strip().splitlines()) == 1
    assert f"{path} exists already: not overwritten" in err
    assert path.read_text(encoding="utf-8") == "# mine\n"


@pytest.mark.parametrize("argv, message", [
    (["study", "start", "9"], "argument N: must be an exercise number from 1 to 8"),
    (["study", "start", "two"], "argument N: must be an exercise number from 1 to 8"),
    (["study", "check"], "required: FILE"),
])
def test_study_usage_errors_exit_2_with_one_line(argv, message, capsys):
    code, _, err = run(argv, capsys)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("content, message", [
    (None, "no such file"),
    ("EXERCISE = 2\ndef backward(x, dp)\n    pass\n", "line 2: syntax error"),
    ("import numpy\nprint('hello')\n", "not a tinyformer study exercise (it has no `EXERCISE = N` line)"),
    ("EXERCISE = 9\n", "EXERCISE must be a number from 1 to 8, got 9"),
    ("EXERCISE = 2\nraise RuntimeError('boom')\n", "line 2: importing it raised RuntimeError: boom"),
    ("EXERCISE = 2\ndef forward(x):\n    return x\n", "exercise 2 needs a function `backward`"),
])
def test_a_file_that_cannot_be_checked_is_one_line_and_exit_2(content, message, tmp_path, capsys):
    path = tmp_path / "mine.py"
    if content is not None:
        path.write_text(content, encoding="utf-8")
    code, out, err = run(["study", "check", str(path)], capsys)
    assert code == 2 and not out
    assert err.startswith(f"tinyformer study: error: {path}") and message in err, err
    assert len(err.strip().splitlines()) == 1


def test_an_exception_in_backward_names_its_line_and_exits_1(tmp_path, capsys):
    path = edited(tmp_path, "02_softmax.py", "    p = forward(x)\n", "    p = forward(x)\n    p = p[None, 99]\n")
    line = path.read_text(encoding="utf-8").splitlines().index("    p = p[None, 99]") + 1
    code, out, _ = run(["study", "check", str(path), "--no-train"], capsys)
    assert code == 1
    assert f"line {line} (`p = p[None, 99]`) raised IndexError in case \"3 rows of 5\"" in out


def test_check_passes_with_exit_0_and_trains_unless_told_not_to(tmp_path, capsys):
    code, out, _ = run(["study", "check", str(solution(tmp_path, "01_chain_rule.py"))], capsys)
    assert code == 0
    assert "exercise 1 has no op in the model" in out and "next: tinyformer study start 2" in out
    code, out, _ = run(["study", "check", str(solution(tmp_path, "05_cross_entropy.py")), "--no-train"], capsys)
    assert code == 0 and "right." in out and "--no-train" in out and "step" not in out
    code, out, _ = run(["study", "check", str(solution(tmp_path, "05_cross_entropy.py")), "--steps", "12"], capsys)
    assert code == 0, out
    assert "CrossEntropy.backward_reference runs your backward while `tiny` trains 12 steps" in out
    assert "step  1: loss" in out and "step 12: loss" in out
    assert ", falling, with your backward called 12 times; tinyformer's own backward is back in place." in out
