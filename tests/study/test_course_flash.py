"""tinyformer.study.course, exercises 7 and 8: FlashAttention's tiled forward and backward by hand.

The reference solutions (tests/study_solutions/07_flash_forward.py, 08_flash_backward.py) pass;
each typical mistake, made as an edit of a reference solution, fails with its name and the tile
and row where it shows: a running sum not rescaled, the max not subtracted (scores of ~1,000),
S or P materialised whole (the memory at 3,072 tokens, its line named), masked or padded keys
leaking, causal tiles computed and thrown away (counted); D from P·dP passes, and is said.
"""

from pathlib import Path

import numpy
import pytest

from tinyformer.study.course import EXERCISES, check
from tinyformer.study.course.flash_cases import prepared_tiled
from tinyformer.study.course.flash_reference import attention, running_state, tiled_backward, tiled_forward

SOLUTIONS = Path(__file__).resolve().parents[1] / "study_solutions"
FORWARD, BACKWARD = EXERCISES[6], EXERCISES[7]


def solution_text(exercise):
    """The file `study start` writes with the reader's function replaced by the reference solution's."""
    marker = f"def {exercise.writes}("
    given, found, _ = exercise.template().partition(marker)
    _, written, body = (SOLUTIONS / exercise.filename).read_text(encoding="utf-8").partition(marker)
    assert found and written
    return given + written + body


def edited(tmp_path, exercise, *edits):
    """A copy of the reference solution with each (old, new) of ``edits`` made (old found exactly once)."""
    text = solution_text(exercise)
    for old, new in edits:
        assert text.count(old) == 1, f"{old!r} is not found once in {exercise.filename}"
        text = text.replace(old, new)
    path = tmp_path / exercise.filename
    path.write_text(text, encoding="utf-8")
    return path


def checked(path):
    report = check(path)
    return report, "\n".join(report.lines())


# ---------------------------------------------------------------------------- the reference solutions
@pytest.mark.parametrize("exercise", [FORWARD, BACKWARD], ids=lambda e: e.filename)
def test_the_reference_solution_passes_with_its_memory_and_tiles(exercise, tmp_path):
    report, text = checked(edited(tmp_path, exercise))
    assert report.passed, text
    assert f"exercise {exercise.number}, {exercise.title}: right." in text
    assert report.peak[0] < 2 << 20 and report.tiles[0] > 0 and report.tiles[1] == 0, report
    assert "none wholly above the diagonal" in text and "note:" not in text


@pytest.mark.parametrize("number", [7, 8])
def test_the_tiled_recurrences_agree_with_the_plain_formula_and_the_op(number):
    for case in prepared_tiled(number):
        q, k, v, lengths, causal = case.args
        block = case.factors["block"]
        o, lse = tiled_forward(q, k, v, lengths, causal, block)
        plain_o, plain_lse = attention(q, k, v, lengths, causal)
        numpy.testing.assert_allclose(o, plain_o, rtol=1e-12, atol=1e-12)
        assert numpy.array_equal(numpy.isneginf(lse), numpy.isneginf(plain_lse))
        if number == 8:
            grads = tiled_backward(q, k, v, o, lse, case.d_out, lengths, causal, block)
            for name, grad in zip(("dQ", "dK", "dV"), grads):
                numpy.testing.assert_allclose(grad, case.expected[name], rtol=1e-10, atol=1e-12)


def test_the_running_state_is_carried_through_skipped_tiles():
    m, l = running_state([(0, 0, 0, 1.0, 2.0), (0, 0, 2, 3.0, 4.0)], 1, 2, 3)
    assert m[0, 0].tolist() == [1.0, 1.0, 3.0] and l[0, 0].tolist() == [2.0, 2.0, 4.0]
    assert m[0, 1].tolist() == [-numpy.inf] * 3 and l[0, 1].tolist() == [0.0] * 3


# ---------------------------------------------------------------------------- the mistakes, one test each
def test_a_running_sum_not_rescaled_is_named_with_its_tile_and_row(tmp_path):
    report, text = checked(edited(tmp_path, FORWARD, ("l = l * correction + p.sum(axis=1)", "l = l + p.sum(axis=1)")))
    assert not report.passed
    assert "O, lse are wrong" in text and "largest error" in text
    assert "what it looks like: the running sum not rescaled when the max changes" in text
    assert ", the max rose at key tile " in text and "must be multiplied by exp(m − m_new)" in text


def test_the_max_not_subtracted_overflows_at_large_logits_only(tmp_path):
    report, text = checked(edited(
        tmp_path, FORWARD,
        ("base = numpy.where(numpy.isfinite(m_new), m_new, 0.0)", "base = numpy.zeros_like(m_new)"),
        ("correction = numpy.exp(m - base)", "correction = numpy.ones_like(m)"),
        ("m + numpy.log(numpy.where(some, l, 1.0))", "numpy.log(numpy.where(some, l, 1.0))")))
    assert not report.passed
    assert 'wrong in 1 of 10 cases (large logits (scores ~ ±1,000))' in text
    assert "what it looks like: the max not subtracted: P = exp(S) overflows at large scores" in text
    assert "whose exp is inf in float64" in text and "key tile" in text


@pytest.mark.parametrize("exercise", [FORWARD, BACKWARD], ids=lambda e: e.filename)
def test_s_materialised_whole_is_caught_by_its_memory_and_its_line_named(exercise, tmp_path):
    length_line = "        length = len_k if key_lengths is None else min(int(key_lengths[b]), len_k)\n"
    path = edited(tmp_path, exercise,
                  (length_line, length_line + "        s_all = q[b] @ k[b].T * scale\n"),
                  ("s = q[b, i0:i1] @ k[b, j0:j1].T * scale", "s = s_all[i0:i1, j0:j1]"))
    line = path.read_text(encoding="utf-8").splitlines().index("        s_all = q[b] @ k[b].T * scale") + 1
    report, text = checked(path)
    assert not report.passed and report.peak[0] >= 64 << 20
    assert f"S or P materialised whole: at 3,072 tokens line {line} (`s_all = q[b] @ k[b].T * scale`) took 72 MiB" \
        in text


def test_padded_keys_leaking_are_named(tmp_path):
    report, text = checked(edited(
        tmp_path, FORWARD,
        ("length = len_k if key_lengths is None else min(int(key_lengths[b]), len_k)", "length = len_k")))
    assert not report.passed
    assert "what it looks like: padded keys leak into the sum: the key length is left out" in text
    assert "holds keys it must not see" in text


def test_masked_keys_at_zero_instead_of_minus_infinity_are_named(tmp_path):
    report, text = checked(edited(tmp_path, FORWARD, ("                                s, -numpy.inf)",
                                                      "                                s, 0.0)")))
    assert not report.passed
    assert "masked keys leak into the sum: a hidden key's score is set to 0 instead of −∞" in text


@pytest.mark.parametrize("exercise, old, new", [
    (FORWARD, "end = min(length, i1 + len_k - len_q) if causal else length", "end = length"),
    (BACKWARD, "first = max(0, j0 - (len_k - len_q)) // block * block if causal else 0", "first = 0"),
], ids=["forward", "backward"])
def test_causal_tiles_computed_and_thrown_away_are_counted(exercise, old, new, tmp_path):
    report, text = checked(edited(tmp_path, exercise, (old, new)))
    assert not report.passed and report.tiles[1] > 0
    assert f"causal tiles computed and thrown away: {report.tiles[1]} of the {report.tiles[0]} score tiles" in text
    assert "lie wholly above the diagonal (e.g. query rows" in text


def test_d_from_p_dp_passes_and_is_said(tmp_path):
    report, text = checked(edited(tmp_path, BACKWARD, ("    delta = (d_out * o).sum(axis=-1)\n", """\
    delta = numpy.zeros(lse.shape)
    for b in range(batch):
        length = len_k if key_lengths is None else min(int(key_lengths[b]), len_k)
        for i0 in range(0, len_q, block):
            i1 = min(i0 + block, len_q)
            for j0 in range(0, min(length, i1 + len_k - len_q) if causal else length, block):
                j1 = min(j0 + block, len_k)
                s = q[b, i0:i1] @ k[b, j0:j1].T * scale
                hidden = ~seen(len_q, len_k, length, causal, numpy.arange(i0, i1), numpy.arange(j0, j1))
                row_lse = lse[b, i0:i1, None]
                p = numpy.exp(numpy.where(hidden | numpy.isinf(row_lse), -numpy.inf, s - row_lse))
                delta[b, i0:i1] += (p * (d_out[b, i0:i1] @ v[b, j0:j1].T)).sum(axis=1)
""")))
    assert report.passed, text
    assert "note: D computed from P·dP (Σⱼ Pᵢⱼ dPᵢⱼ; your backward never reads O): right, but" in text


def test_lse_recomputed_instead_of_read_passes_and_is_said(tmp_path):
    report, text = checked(edited(tmp_path, BACKWARD, ("    delta = (d_out * o).sum(axis=-1)\n", """\
    delta = (d_out * o).sum(axis=-1)
    lse = numpy.full((batch, len_q), -numpy.inf)  # recomputed: the saved one unused
    for b in range(batch):
        length = len_k if key_lengths is None else min(int(key_lengths[b]), len_k)
        for i0 in range(0, len_q, block):
            i1 = min(i0 + block, len_q)
            for j0 in range(0, min(length, i1 + len_k - len_q) if causal else length, block):
                j1 = min(j0 + block, len_k)
                s = numpy.where(seen(len_q, len_k, length, causal, numpy.arange(i0, i1), numpy.arange(j0, j1)),
                                q[b, i0:i1] @ k[b, j0:j1].T * scale, -numpy.inf)
                lse[b, i0:i1] = numpy.logaddexp(lse[b, i0:i1], numpy.logaddexp.reduce(s, axis=1))
""")))
    assert report.passed, text
    assert "note: your backward never reads lse: it recomputes softmax's max and sum" in text
    assert "D computed from P·dP" not in text


def test_d_from_the_row_sum_of_do_alone_is_named(tmp_path):
    report, text = checked(edited(tmp_path, BACKWARD, ("delta = (d_out * o).sum(axis=-1)", "delta = d_out.sum(axis=-1)")))
    assert not report.passed
    assert "what it looks like: D = rowsum(dO) where it is rowsum(dO ∘ O)" in text


def test_padded_keys_leaking_into_the_backward_are_named(tmp_path):
    report, text = checked(edited(
        tmp_path, BACKWARD,
        ("length = len_k if key_lengths is None else min(int(key_lengths[b]), len_k)", "length = len_k")))
    assert not report.passed
    assert "padded keys leak into the backward: the key length is left out" in text


def test_p_as_exp_s_times_exp_minus_lse_overflows_at_large_logits(tmp_path):
    report, text = checked(edited(
        tmp_path, BACKWARD,
        ("p = numpy.exp(numpy.where(hidden | numpy.isinf(row_lse), -numpy.inf, s - row_lse))",
         "p = numpy.where(hidden | numpy.isinf(row_lse), 0.0, numpy.exp(s) * numpy.exp(-row_lse))")))
    assert not report.passed
    assert "wrong in 1 of 10 cases (large logits" in text
    assert "P taken as exp(S)·exp(−lse): exp(S) overflows at large scores" in text


def test_an_unwritten_exercise_says_so(tmp_path):
    for exercise in (FORWARD, BACKWARD):
        path = tmp_path / exercise.filename
        path.write_text(exercise.template(), encoding="utf-8")
        report, text = checked(path)
        assert report.not_written and not report.passed
        assert f"{exercise.writes} is not written yet" in text


# ---------------------------------------------------------------------------- from the loop to the kernel
@pytest.mark.usefixtures("cxx_compiler")  # the emulated kernel: skipped without g++ or clang++
def test_the_emulated_kernels_trace_matches_the_reference_recurrence_tile_by_tile(tmp_path):
    from tinyformer.study.course import load
    from tinyformer.study.course.flash_kernel import trace

    module, _ = load(edited(tmp_path, FORWARD))
    rng = numpy.random.default_rng(5)
    q, k, v = rng.normal(size=(2, 40, 32)), 2 * rng.normal(size=(2, 70, 32)), rng.normal(size=(2, 70, 32))
    found = trace(module, q, k, v, numpy.array([70, 37]), True)
    assert found.tiles == 3
    (km, kl, klse), (rm, rl, rlse), (ym, yl, ylse) = found.kernel, found.reference, found.yours
    assert numpy.array_equal(numpy.isfinite(km), numpy.isfinite(rm)) and numpy.isfinite(rm).any()
    seen = numpy.isfinite(rm)
    numpy.testing.assert_allclose(km[seen], rm[seen], rtol=1e-5, atol=1e-5)
    numpy.testing.assert_allclose(kl, rl, rtol=1e-5, atol=1e-6)
    numpy.testing.assert_allclose(klse, rlse, rtol=1e-5, atol=1e-5)
    assert (numpy.diff(rm, axis=-1)[seen[..., 1:]] > 0).any()  # the max does rise from tile to tile somewhere
    numpy.testing.assert_allclose(yl, rl, rtol=1e-12) and numpy.testing.assert_allclose(ylse, rlse, rtol=1e-12)


def test_the_kernel_lines_of_each_step_are_found_in_the_sources():
    from tinyformer.study.course.flash_kernel import kernel_lines

    for number in (7, 8):
        for step, filename, line, text in kernel_lines(number):
            assert line is not None, f"exercise {number}: {step!r} is no longer in {filename}"


# ---------------------------------------------------------------------------- the swap into a model
@pytest.mark.parametrize("exercise", [FORWARD, BACKWARD], ids=lambda e: e.filename)
def test_a_model_with_the_readers_tiles_learns_as_with_tinyformers_own(exercise, tmp_path):
    from tinyformer.study.course import load, swap

    module, _ = load(edited(tmp_path, exercise))
    own = swap.train(exercise.number, None, steps=40, max_tokens=256, echo=lambda *a: None)
    yours = swap.train(exercise.number, module, steps=40, max_tokens=256, echo=lambda *a: None)
    assert yours.calls == 40 * 6 and own.calls == 0
    assert yours.falling and yours.last < yours.first - 1.0, yours.losses
    assert numpy.abs(numpy.array(yours.losses) - numpy.array(own.losses)).max() < 0.05, (yours.losses, own.losses)


@pytest.mark.slow
@pytest.mark.parametrize("exercise", [FORWARD, BACKWARD], ids=lambda e: e.filename)
def test_the_swap_trains_the_built_in_task_to_the_same_exact_match_rate(exercise, tmp_path):
    from tinyformer.study.course import load, swap

    module, _ = load(edited(tmp_path, exercise))
    steps = swap.EXACT_MATCH_STEPS
    own = swap.train(exercise.number, None, steps=steps, sentences=100, echo=lambda *a: None)
    yours = swap.train(exercise.number, module, steps=steps, sentences=100, echo=lambda *a: None)
    assert own.exact_match >= 0.9, own.exact_match  # the task learned, not a rate of noise
    assert abs(yours.exact_match - own.exact_match) <= swap.EXACT_MATCH_SLACK, (yours.exact_match, own.exact_match)


# ---------------------------------------------------------------------------- the command line
def _run(argv, capsys):
    from tinyformer import cli

    try:
        code = cli.main(argv)
    except SystemExit as exit_:
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out, err


def test_check_shows_the_recurrence_in_the_kernels_source(tmp_path, capsys):
    for exercise, line in ((FORWARD, "attention.cu:"), (BACKWARD, "ds = p * (dp - delta_tile[lane]);")):
        code, out, _ = _run(["study", "check", str(edited(tmp_path, exercise)), "--no-train"], capsys)
        assert code == 0 and "right." in out
        assert "the same recurrence in tinyformer's CUDA kernels" in out and line in out
        assert f"(--no-train: your {exercise.writes} was not tried inside a model.)" in out
    assert "trace the kernel beside your loop: tinyformer study trace" not in out  # exercise 8's


@pytest.mark.usefixtures("cxx_compiler")
def test_study_trace_prints_the_kernels_running_state_beside_the_readers(tmp_path, capsys):
    path = edited(tmp_path, FORWARD)
    code, out, _ = _run(["study", "trace", str(path), "--queries", "5", "--keys", "40", "--causal", "--rows", "2"],
                        capsys)
    assert code == 0, out
    assert "attention.cu's forward (emulated on the CPU, float32, key tiles of 32)" in out
    assert out.count("lse = m + log l: kernel") == 2 and "largest difference over all 5 rows and 2 tiles" in out
    unwritten = tmp_path / "fresh" / FORWARD.filename
    unwritten.parent.mkdir()
    unwritten.write_text(FORWARD.template(), encoding="utf-8")
    code, out, _ = _run(["study", "trace", str(unwritten)], capsys)
    assert code == 1 and "forward is not written yet" in out
    other = tmp_path / "other" / BACKWARD.filename
    other.parent.mkdir()
    other.write_text(BACKWARD.template(), encoding="utf-8")
    code, _, err = _run(["study", "trace", str(other)], capsys)
    assert code == 2 and "trace follows exercise 7's forward" in err and len(err.strip().splitlines()) == 1
