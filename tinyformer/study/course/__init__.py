"""A study path through backpropagation: exercises where the reader writes the backward.

``tinyformer study`` lists the course, ``tinyformer study start N [DIR]`` writes exercise N (the
forward pass given in NumPy, ``backward`` to write, the maths to derive in its docstrings),
``tinyformer study check FILE`` checks the reader's backward and ``tinyformer study trace FILE``
runs exercise 7's forward beside the emulated CUDA kernel:

* ``exercises``: the course (``EXERCISES``), the templates and writing them;
* ``cases``: the inputs each exercise is checked on, tinyformer's own gradients for them and
  float64 central differences of the given forward;
* ``checker``: loading the reader's file, running it, the report;
* ``diagnosis`` and ``mistakes``: where a gradient is wrong, how much, and which typical
  mistake it looks like;
* ``swap``: once the backward is right, it replaces tinyformer's own inside a real model, which
  trains on the built-in task as the proof;
* exercises 7 and 8, FlashAttention's tiled forward and backward: ``flash_reference`` (the tile
  recurrences, and the mistakes' answers), ``flash_cases``, ``flash_check`` with ``flash_mistakes``
  and ``flash_probes`` (memory at 3,072 tokens, tiles thrown away), ``flash_kernel`` (the kernels'
  lines of the recurrence, and the emulated kernel's trace), ``flash_swap``;
* ``reader_code``: what the reader's code raised, and where, in one line.

The reference solutions live in tests/study_solutions, not here.
"""

from .checker import ExerciseFileError, Report, check, load
from .exercises import EXERCISES, Exercise, exercise, write_exercise

__all__ = ["EXERCISES", "Exercise", "exercise", "write_exercise", "check", "load", "Report", "ExerciseFileError"]
