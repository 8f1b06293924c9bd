"""What the writing commands do with where they write (docs/guarantees.md, "What tinyformer writes, and
where"): an import never writes into the Marian folder it reads; no export replaces an existing file,
whatever the format; no export writes NaN or Inf; a written run folder gets the mode the umask gives."""

import os
import shutil
import stat

import numpy as np
import pytest
from trained_models import make_tiny_run

from tinyformer import cli

# transformers' MarianTokenizer, which builds the Marian folder, asks for sacremoses (it does not use it)
pytestmark = pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses")


def run_cli(capsys, *argv):
    try:
        code = cli.main([str(a) for a in argv])
    except SystemExit as exit_:
        code = exit_.code
    out, err = capsys.readouterr()
    return code, err.splitlines()


def listing(folder):
    """Every path under ``folder`` with its bytes (None for a folder)."""
    return {p.relative_to(folder): None if p.is_dir() else p.read_bytes() for p in folder.rglob("*")}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("run")
    make_tiny_run(folder)
    return folder


@pytest.fixture(scope="module")
def marian_folder(tmp_path_factory):
    pytest.importorskip("transformers")
    pytest.importorskip("torch")
    from marian_folders import make_marian_folder

    return make_marian_folder(tmp_path_factory.mktemp("marian") / "opus-mt-xx-yy", d_model=16, encoder_layers=1,
                              heads=2, ffn=32)[0]


NAN_PARAMETER = "decoder.layers.0.feed_forward.linear2.weight"


def with_a_nan(run, destination):
    """A copy of ``run`` whose checkpoint holds a NaN in NAN_PARAMETER (written past save_checkpoint,
    which refuses it)."""
    shutil.copytree(run, destination)
    path = sorted(destination.glob("checkpoint_*.npz"))[-1]
    with np.load(path, allow_pickle=False) as stored:
        arrays = {name: stored[name] for name in stored.files}
    arrays[f"model/{NAN_PARAMETER}"] = arrays[f"model/{NAN_PARAMETER}"].copy()
    arrays[f"model/{NAN_PARAMETER}"][0, 0] = np.nan
    np.savez(path, **arrays)
    return destination


# ------------------------------------------------------------------------ import: not into what it reads
@pytest.mark.parametrize("inside", ["run", "sub/run", "link/run"])
def test_an_import_into_the_marian_folder_it_reads_is_refused(marian_folder, inside, tmp_path, capsys):
    folder = tmp_path / "opus-mt"
    shutil.copytree(marian_folder, folder)
    (tmp_path / "link").symlink_to(folder)
    before = listing(folder)
    output = (tmp_path if inside.startswith("link") else folder) / inside
    code, err = run_cli(capsys, "import", "marian", folder, "--output", output)
    assert code == 1 and len(err) == 1, err
    assert err[0].startswith(f"tinyformer import: error: --output {output} lies inside the folder being read, "
                             f"{folder}"), err
    assert listing(folder) == before


def test_an_import_of_a_state_dict_may_write_its_run_beside_the_file(run, tmp_path, capsys):
    """The torch source is one file, not a folder: a run beside it is not inside what is read."""
    weights = tmp_path / "model.safetensors"
    assert run_cli(capsys, "export", run, "--format", "torch", "--output", weights) == (0, [])
    assert run_cli(capsys, "import", "torch", weights, "--tokenizer", run / "spm.model",
                   "--output", tmp_path / "imported") == (0, [])


# ------------------------------------------------------------------------ export: never over a file
@pytest.mark.parametrize("form, given", [("safetensors", True), ("safetensors", False), ("torch", True)],
                         ids=["safetensors", "safetensors-default-output", "torch"])
def test_no_export_replaces_an_existing_file(run, form, given, tmp_path, capsys):
    source = tmp_path / "run"
    shutil.copytree(run, source)
    target = tmp_path / "notes.safetensors" if given else source / "checkpoint_0000001.safetensors"
    target.write_text("my notes\n", encoding="utf-8")
    code, err = run_cli(capsys, "export", source, "--format", form, *(["--output", target] if given else []))
    assert code == 1 and len(err) == 1 and f"{target} already exists: choose a new name" in err[0], err
    assert target.read_text(encoding="utf-8") == "my notes\n"
    assert not list(tmp_path.glob("notes.json")) and sorted(p.name for p in source.iterdir()) == sorted(
        [p.name for p in run.iterdir()] + ([] if given else [target.name]))


# ------------------------------------------------------------------------ export: never NaN or Inf
@pytest.mark.parametrize("form", ["safetensors", "torch", "marian"])
def test_no_export_writes_a_model_holding_nan(run, marian_folder, form, tmp_path, capsys):
    if form == "marian":  # a Marian run: only those export as Marian
        assert run_cli(capsys, "import", "marian", marian_folder, "--output", tmp_path / "finite")[0] == 0
        source = with_a_nan(tmp_path / "finite", tmp_path / "nan")
    else:
        source = with_a_nan(run, tmp_path / "nan")
    output = tmp_path / ("out" if form == "marian" else "out.safetensors")
    before = set(tmp_path.iterdir())
    code, err = run_cli(capsys, "export", source, "--format", form, "--output", output)
    assert code == 1 and len(err) == 1 and "NaN or Inf" in err[0], err
    assert NAN_PARAMETER in err[0] or form == "torch", err  # torch names its own tensor (linear2, in_proj, ...)
    assert set(tmp_path.iterdir()) == before


# ------------------------------------------------------------------------ run folders: the umask's mode
@pytest.mark.parametrize("umask", [0o022, 0o027, 0o077], ids=oct)
def test_written_runs_and_files_get_the_mode_the_umask_gives(run, umask, tmp_path, capsys):
    """As mkdir's and open's: a folder 0o777 less the umask, a file 0o666 less it; an export's files,
    an imported run and its files (train --init-from's copy of a tokenizer folder is made by the same
    ``new_folder``)."""
    from tinyformer.common.atomic import new_folder

    weights, imported = tmp_path / "model.safetensors", tmp_path / "imported"
    old = os.umask(umask)
    try:
        exported = run_cli(capsys, "export", run, "--format", "torch", "--output", weights)
        code, err = run_cli(capsys, "import", "torch", weights, "--tokenizer", run / "spm.model", "--output", imported)
        made = new_folder(tmp_path, ".x.", ".partial")
    finally:
        os.umask(old)
    assert exported[0] == 0 and code == 0, (exported, err)
    for path in (weights, weights.with_suffix(".json"), *imported.iterdir()):
        assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask, (path, oct(path.stat().st_mode))
    for folder in (imported, made):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o777 & ~umask, (folder, oct(folder.stat().st_mode))
    assert made.name.startswith(".x.") and made.name.endswith(".partial") and list(made.iterdir()) == []


def test_a_marian_import_and_export_get_the_mode_the_umask_gives(marian_folder, tmp_path, capsys):
    old = os.umask(0o027)
    try:
        imported = run_cli(capsys, "import", "marian", marian_folder, "--output", tmp_path / "run")
        exported = run_cli(capsys, "export", tmp_path / "run", "--format", "marian", "--output", tmp_path / "back")
    finally:
        os.umask(old)
    assert imported[0] == 0 and exported[0] == 0, (imported, exported)
    for path in (tmp_path / "run", *(tmp_path / "run").rglob("*"), tmp_path / "back", *(tmp_path / "back").iterdir()):
        assert stat.S_IMODE(path.stat().st_mode) == (0o750 if path.is_dir() else 0o640), (path, oct(path.stat().st_mode))
