"""Imported runs and exported files written whole or not at all, for every foreign format.

An import builds its run in a temporary folder beside ``--output`` and renames it into place
(``build_beside``; the folder gets the mode mkdir gives, 0o777 less the umask), never inside the folder it
reads (``check_output``); an export of several files writes each under a temporary name beside it and
renames them all at the end (``write_files_whole``); no export replaces an existing file
(``check_new_files``). A refused or interrupted command leaves nothing behind.
"""

import os
import shutil
from pathlib import Path

from ...common.atomic import new_file, new_folder
from ..checkpoint import CheckpointError, list_checkpoints
from ..train.migration import FORMAT
from .tensor_files import InteropError

__all__ = ["IMPORTED_CHECKPOINT", "check_output", "check_new_files", "build_beside", "write_files_whole",
           "imported_metadata", "newest_checkpoint"]

IMPORTED_CHECKPOINT = "checkpoint_0000000.npz"


def check_output(output, what, reading=None):
    """``output`` as a Path, refused (naming ``what``) unless it is new or an empty folder, and not inside
    the folder ``reading`` (links followed): an import does not change the folder it reads."""
    output = Path(output)
    if reading is not None and Path(reading).is_dir() and output.resolve().is_relative_to(Path(reading).resolve()):
        raise InteropError(f"{what} {output} lies inside the folder being read, {reading}: choose a folder "
                           "outside it")
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise InteropError(f"{what} {output} already exists and is not an empty folder: choose a new one")
    return output


def build_beside(output, fill):
    """Make ``output`` whole: ``fill(folder)`` writes into a temporary folder beside it, renamed into place."""
    output.parent.mkdir(parents=True, exist_ok=True)
    staging = new_folder(output.parent, f".{output.name}.", ".partial")
    try:
        fill(staging)
        if output.is_dir():
            output.rmdir()  # empty, checked
        staging.rename(output)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return output


def write_files_whole(writers, what="--output"):
    """Write new files ({path: write(temporary path)}) all or none: each is written under a temporary name
    beside it, then all are renamed into place; an existing file or a missing folder is refused first."""
    paths = check_new_files(writers, what)
    temporary, placed = {}, []
    try:
        for path, write in zip(paths, writers.values()):
            fd, name = new_file(path.parent, f".{path.name}.", ".partial")  # 0o666 less the umask
            os.close(fd)
            temporary[path] = name
            write(temporary[path])
        for path in paths:
            os.replace(temporary.pop(path), path)
            placed.append(path)
    except BaseException:
        for path in [*temporary.values(), *placed]:
            path.unlink(missing_ok=True)
        raise
    return paths


def check_new_files(paths, what="--output"):
    """``paths`` as Paths, refused (naming ``what``) if one exists, whatever it holds, or its folder does not."""
    paths = [Path(path) for path in paths]
    for path in paths:
        if path.exists() or path.is_symlink():
            raise InteropError(f"{what}: {path} already exists: choose a new name")
        if not path.parent.is_dir():
            raise InteropError(f"{what}: the folder {path.parent} does not exist")
    return paths


def imported_metadata(config, tokenizer, tokenizer_file, imported_from):
    """The metadata of an imported run's checkpoint: step 0, no optimiser state, like an averaged one."""
    return {"format": FORMAT, "model_config": config.to_dict(), "step": 0, "epoch": 0, "batch_in_epoch": 0,
            "tokens_seen": 0, "skipped_updates": 0, "tokenizer_sha256": tokenizer.sha256,
            "tokenizer_file": tokenizer_file, "imported_from": imported_from}


def newest_checkpoint(source):
    """``source`` itself, or a run directory's newest checkpoint."""
    source = Path(source)
    if source.is_dir():
        found = list_checkpoints(source)
        if not found:
            raise CheckpointError(f"no checkpoint_*.npz in {source}")
        source = found[-1]
    return source
