"""One run of benchmarks/bench_step.py on the `tiny` preset, shared by the tests that read its
report (cli/test_commands.py, benchmarks/test_bench_step.py): a run spends most of its ~12 s measuring the
machine's sgemm peak, so the tests read one run's markdown report instead of each starting their
own. Made once per test run, whatever the number of pytest-xdist workers, like the trained models
(``trained_models.shared_directory``)."""

import children
from trained_models import shared_directory

from tinyformer.common.filecache import cached_product

# Two timed steps after a warm-up (a median of two), as markdown: one report answers every reader.
TOKENS = 64
ARGS = ("--preset", "tiny", "--tokens", str(TOKENS), "--repeats", "2", "--warmup", "1", "--markdown")


def tiny_step_report(tmp_path_factory):
    """The standard output of ``bench_step.py ARGS`` (run now unless a process of this test run has)."""
    def make(partial):
        result = children.run([children.PYTHON, "benchmarks/bench_step.py", *ARGS], timeout=300)
        assert result.returncode == 0, result.stderr
        partial.write_text(result.stdout, encoding="utf-8")

    return cached_product(shared_directory(tmp_path_factory), "bench-step-tiny.md", make).read_text(encoding="utf-8")


def markdown_table(report):
    """(header, first row) of the report's markdown table, as lists of stripped cells."""
    lines = [line for line in report.splitlines() if line.startswith("| ")]
    header, row = ([cell.strip() for cell in line.strip("|").split("|")] for line in lines[:2])
    return header, row
