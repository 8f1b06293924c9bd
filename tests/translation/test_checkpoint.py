"""Checkpoints: round trip, atomic writes, pruning, averaging, refusing bad files."""

import os
import stat
import textwrap

import children
import numpy as np
import pytest

from tinyformer.translation import checkpoint
from tinyformer.translation.checkpoint import CheckpointError
from tinyformer.translation.train.averaging import average_checkpoints


def _state(seed):
    rng = np.random.default_rng(seed)
    return {"encoder.w": rng.standard_normal((3, 4)).astype(np.float32),
            "bias": rng.standard_normal(4).astype(np.float32)}


def test_round_trip_with_adam_state_and_metadata(tmp_path):
    adam = {"step_count": 7, "betas": [0.9, 0.98], "eps": 1e-9, "m": [np.ones((3, 4)), None],
            "v": [np.full((3, 4), 2.0), None]}
    meta = {"step": 7, "config": {"preset": "tiny"}, "rng_state": {"state": 2**100}}
    path = checkpoint.save_checkpoint(tmp_path / "c.npz", _state(0), meta, adam)
    state, meta2, adam2 = checkpoint.load_checkpoint(path)
    for k, v in _state(0).items():
        np.testing.assert_array_equal(state[k], v)
        assert state[k].dtype == np.float32
    assert meta2["step"] == 7 and meta2["rng_state"]["state"] == 2**100
    assert adam2["step_count"] == 7 and adam2["m"][1] is None
    np.testing.assert_array_equal(adam2["v"][0], 2.0)


def test_file_holds_no_pickles(tmp_path):
    path = checkpoint.save_checkpoint(tmp_path / "c.npz", _state(0), {"step": 1})
    with np.load(path, allow_pickle=False) as npz:
        assert all(npz[k].dtype != object for k in npz.files)


def test_failed_save_leaves_previous_checkpoint_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "c.npz"
    checkpoint.save_checkpoint(path, _state(0), {"step": 1})

    def crash(*args, **kwargs):
        raise KeyboardInterrupt  # as if the process were stopped mid-write

    monkeypatch.setattr(np, "savez", crash)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save_checkpoint(path, _state(1), {"step": 2})
    monkeypatch.undo()
    state, meta, _ = checkpoint.load_checkpoint(path)
    assert meta["step"] == 1
    np.testing.assert_array_equal(state["bias"], _state(0)["bias"])
    assert [p.name for p in tmp_path.iterdir()] == ["c.npz"]


def test_process_killed_mid_write_leaves_previous_checkpoint_loadable(tmp_path):
    """A real SIGKILL while a large checkpoint is being written: the old file is intact."""
    path = tmp_path / "checkpoint_0000001.npz"
    checkpoint.save_checkpoint(path, _state(0), {"step": 1})
    script = textwrap.dedent(f"""
        import numpy as np, os, signal
        from tinyformer.translation import checkpoint
        real_savez = np.savez
        def savez_then_die(f, **arrays):
            real_savez(f, **arrays)  # the temporary file is fully written ...
            f.flush()
            os.kill(os.getpid(), signal.SIGKILL)  # ... and the process dies before the rename
        np.savez = savez_then_die
        checkpoint.save_checkpoint({str(path)!r}, {{"bias": np.zeros(1_000_000, np.float32)}}, {{"step": 2}})
    """)
    result = children.run([children.PYTHON, "-c", script], timeout=120)
    assert result.returncode == -9, result.stderr
    _, meta, _ = checkpoint.load_checkpoint(path)
    assert meta["step"] == 1
    assert checkpoint.list_checkpoints(tmp_path) == [path]


def test_corrupt_or_missing_file_is_named(tmp_path):
    bad = tmp_path / "checkpoint_0000003.npz"
    bad.write_bytes(b"not a zip file")
    with pytest.raises(CheckpointError, match="checkpoint_0000003.npz"):
        checkpoint.load_checkpoint(bad)
    with pytest.raises(CheckpointError, match="missing.npz does not exist"):
        checkpoint.load_checkpoint(tmp_path / "missing.npz")


def test_list_and_prune_keep_the_newest(tmp_path):
    for step in (5, 20, 10, 15):
        checkpoint.save_checkpoint(checkpoint.checkpoint_path(tmp_path, step), _state(step), {"step": step})
    (tmp_path / "notes.txt").write_text("kept")
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path)] == [
        "checkpoint_0000005.npz", "checkpoint_0000010.npz", "checkpoint_0000015.npz", "checkpoint_0000020.npz"]
    removed = checkpoint.prune_checkpoints(tmp_path, keep_last=2)
    assert [p.name for p in removed] == ["checkpoint_0000005.npz", "checkpoint_0000010.npz"]
    assert len(checkpoint.list_checkpoints(tmp_path)) == 2 and (tmp_path / "notes.txt").exists()


def test_averaging_identical_checkpoints_is_the_identity(tmp_path):
    paths = [checkpoint.save_checkpoint(tmp_path / f"c{i}.npz", _state(0),
                                        {"step": i, "tokenizer_sha256": "abc"}) for i in range(5)]
    out = average_checkpoints(paths, tmp_path / "avg.npz")
    state, meta, adam = checkpoint.load_checkpoint(out)
    for k, v in _state(0).items():
        np.testing.assert_array_equal(state[k], v)
    assert meta["step"] == 4 and adam is None and len(meta["averaged_from"]) == 5


def test_averaging_takes_the_mean(tmp_path):
    paths = [checkpoint.save_checkpoint(tmp_path / f"c{i}.npz", _state(i), {"step": i}) for i in range(3)]
    state, _, _ = checkpoint.load_checkpoint(average_checkpoints(paths, tmp_path / "avg.npz"))
    expected = np.mean([_state(i)["encoder.w"].astype(np.float64) for i in range(3)], axis=0)
    np.testing.assert_allclose(state["encoder.w"], expected, rtol=1e-6)


def test_averaging_refuses_mismatched_checkpoints(tmp_path):
    a = checkpoint.save_checkpoint(tmp_path / "a.npz", _state(0), {"step": 1, "tokenizer_sha256": "x"})
    other = dict(_state(0), extra=np.zeros(2, np.float32))
    b = checkpoint.save_checkpoint(tmp_path / "b.npz", other, {"step": 2, "tokenizer_sha256": "x"})
    c = checkpoint.save_checkpoint(tmp_path / "c.npz", _state(0), {"step": 3, "tokenizer_sha256": "y"})
    with pytest.raises(CheckpointError, match="b.npz"):
        average_checkpoints([a, b], tmp_path / "out.npz")
    with pytest.raises(CheckpointError, match="different tokenizer"):
        average_checkpoints([a, c], tmp_path / "out.npz")
    with pytest.raises(CheckpointError, match="no checkpoints"):
        average_checkpoints([], tmp_path / "out.npz")
    assert not (tmp_path / "out.npz").exists()


# ------------------------------------------------------------------ never a NaN or Inf on disk
@pytest.mark.parametrize("where, bad, named", [
    ("model", np.nan, "parameter 'encoder.w'"),
    ("model", -np.inf, "parameter 'encoder.w'"),
    ("adam", np.inf, "Adam moment 'adam/v/0'"),
])
def test_a_state_holding_nan_or_inf_is_never_written(tmp_path, where, bad, named):
    path = tmp_path / "checkpoint_0000002.npz"
    checkpoint.save_checkpoint(path, _state(0), {"step": 2})
    before = path.read_bytes()
    state = _state(1)
    adam = {"step_count": 3, "m": [np.zeros((3, 4)), None], "v": [np.ones((3, 4)), None]}
    if where == "model":
        state["encoder.w"][1, 2] = bad
    else:
        adam["v"][0][0, 0] = bad
    with pytest.raises(CheckpointError, match=f"refusing to write checkpoint .*checkpoint_0000002.npz: {named} "
                                              "holds 1 non-finite value"):
        checkpoint.save_checkpoint(path, state, {"step": 3}, adam)
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == [path.name]


def test_metadata_must_be_plain_json(tmp_path):
    with pytest.raises(CheckpointError, match="metadata is not plain JSON"):
        checkpoint.save_checkpoint(tmp_path / "c.npz", _state(0), {"step": 1, "lr": float("nan")})
    assert not list(tmp_path.iterdir())


def test_averaging_refuses_another_architecture_with_the_same_shapes(tmp_path):
    """heads=4 and heads=8 give identical shapes: only model_config tells them apart."""
    a = checkpoint.save_checkpoint(tmp_path / "a.npz", _state(0), {"step": 1, "model_config": {"heads": 4}})
    b = checkpoint.save_checkpoint(tmp_path / "b.npz", _state(1), {"step": 2, "model_config": {"heads": 8}})
    with pytest.raises(CheckpointError, match=r"b.npz is another model than .*a.npz \(heads: 8 vs 4\)"):
        average_checkpoints([a, b], tmp_path / "out.npz")


def test_partial_files_of_a_killed_save_are_recognised_and_removed(tmp_path):
    keep = [checkpoint.save_checkpoint(checkpoint.checkpoint_path(tmp_path, 1), _state(0), {"step": 1}),
            tmp_path / "notes.npz.txt", tmp_path / "metrics.jsonl"]
    for p in keep[1:]:
        p.write_text("kept")
    partial = tmp_path / "checkpoint_0000002.npz.k3j_x9ab.tmp"
    partial.write_bytes(b"PK\x03\x04 half a zip")
    assert checkpoint.list_checkpoints(tmp_path) == [keep[0]]
    assert checkpoint.remove_partial_files(tmp_path) == [partial]
    assert sorted(tmp_path.iterdir()) == sorted(keep)


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_files_written_whole_get_the_mode_of_any_new_file(tmp_path, umask, mode):
    """A checkpoint, a tokenizer file or a page is written to a temporary file and renamed: it gets
    0o666 less the umask, as a file opened for writing would (not mkstemp's 0o600)."""
    from tinyformer.common.atomic import write_atomically

    old = os.umask(umask)
    try:
        path = tmp_path / "checkpoint_0000001.npz"
        checkpoint.save_checkpoint(path, {"w": np.ones(2, dtype=np.float32)}, {"step": 1})
        write_atomically(tmp_path / "page.html", b"<html></html>")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == mode
    assert stat.S_IMODE((tmp_path / "page.html").stat().st_mode) == mode
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint_0000001.npz", "page.html"]


def test_what_is_not_a_regular_file_is_never_replaced(tmp_path):
    from tinyformer.common.atomic import write_atomically

    with pytest.raises(IsADirectoryError, match="is not a regular file"):
        write_atomically(tmp_path, b"data")
    if os.path.exists(os.devnull):
        with pytest.raises(IsADirectoryError, match="is not a regular file"):
            write_atomically(os.devnull, b"data")
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------- older metadata (train.migration)
def test_the_metadata_of_an_older_writer_is_read_with_todays_fields():
    from tinyformer.translation.train.migration import FORMAT, migrate

    older = {"format": FORMAT, "step": 3, "epoch": 0, "batch_in_epoch": 3, "tokens_seen": 90,
             "config": {"preset": "tiny", "label_smoothing": 0.1},
             "model_config": {"d_model": 16, "label_smoothing": 0.1}}
    today = migrate(older, "c.npz")
    assert today["model_config"] == {"d_model": 16, "final_norm": None, "init": "xavier", "activation": "relu",
                                     "encoder_layers": None, "decoder_layers": None, "scale_embedding": True,
                                     "logits_bias": False}
    assert today["config"] == {"paper": True, "preset": "tiny", "label_smoothing": 0.1}
    assert today["skipped_updates"] == 0 and today["train_seconds"] == 0.0
    assert "label_smoothing" in older["model_config"] and "skipped_updates" not in older  # left as the file holds it
    newer = {"format": FORMAT, "skipped_updates": 2, "train_seconds": 125.5, "config": {"paper": False},
             "model_config": {"final_norm": True, "init": "torch", "activation": "silu", "encoder_layers": 2,
                              "decoder_layers": 1, "scale_embedding": False, "logits_bias": True}}
    assert migrate(newer, "c.npz") == newer  # today's fields are kept as they are


def test_a_checkpoint_of_an_unknown_format_is_refused_by_name(tmp_path):
    from tinyformer.translation.train import load_model

    path = checkpoint.save_checkpoint(tmp_path / "c.npz", _state(0),
                                      {"format": "tinyformer-checkpoint-9", "model_config": {"d_model": 16}})
    with pytest.raises(CheckpointError, match=r"c.npz is in format 'tinyformer-checkpoint-9', which this version "
                                              r"of tinyformer does not read \(it reads 'tinyformer-checkpoint-1'\)"):
        load_model(path)


def test_averaging_reads_each_checkpoint_through_the_migration(tmp_path):
    """A run resumed by a later version holds checkpoints whose metadata differ only in what that version
    added (here ``init`` and ``final_norm``, absent from the older one): they are one model, and average."""
    state = {"w": np.ones((2, 2), np.float32)}
    newer = {"model_config": {"d_model": 4, "init": "xavier", "final_norm": None}, "step": 2}
    older = {"model_config": {"d_model": 4, "label_smoothing": 0.1}, "step": 1}
    a = checkpoint.save_checkpoint(tmp_path / "checkpoint_0000001.npz", state, older)
    b = checkpoint.save_checkpoint(tmp_path / "checkpoint_0000002.npz", state, newer)
    average_checkpoints([a, b], tmp_path / "avg.npz")
    other = checkpoint.save_checkpoint(tmp_path / "checkpoint_0000003.npz", state,
                                       {"model_config": {"d_model": 4, "init": "torch"}, "step": 3})
    with pytest.raises(CheckpointError, match="another model"):
        average_checkpoints([a, other], tmp_path / "avg2.npz")
