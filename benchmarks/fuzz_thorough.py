"""Every property and fuzz test (the hypothesis tests) under the ``thorough`` profile of
tests/conftest.py: ten times each test's usual number of examples, no deadline, random seeds.

    python benchmarks/fuzz_thorough.py [--log FILE] [PYTEST_ARGS ...]

It runs ``python -m pytest -m hypothesis --hypothesis-profile=thorough --hypothesis-show-statistics``
from the repository root, keeps the whole output in ``--log`` (default: fuzz_thorough.log in the
temporary folder), and prints the number of examples hypothesis actually ran (summed from its
statistics), the time, and every test that failed. The exit status is pytest's.
"""

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMMAND = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", "-m", "hypothesis",
           "--hypothesis-profile=thorough", "--hypothesis-show-statistics", "tests"]
TEST_HEADER = re.compile(r"^(\S+::.+):$")
CASES = re.compile(r"^\s+- (\d+) passing, (\d+) failing, and (\d+) invalid test cases$")


def parse_statistics(text):
    """{test id: [passing, failing, invalid]} from hypothesis' statistics, summed over its phases."""
    counts, current = {}, None
    for line in text.splitlines():
        if header := TEST_HEADER.match(line):
            current = counts.setdefault(header.group(1), [0, 0, 0])
        elif (cases := CASES.match(line)) and current is not None:
            for i, value in enumerate(cases.groups()):
                current[i] += int(value)
    return counts


def failed_tests(text):
    """The ids pytest's short summary lists as FAILED or ERROR."""
    return re.findall(r"^(?:FAILED|ERROR) (\S+)", text, flags=re.M)


def summary(counts, failures, seconds, status):
    passing = sum(c[0] for c in counts.values())
    failing = sum(c[1] for c in counts.values())
    invalid = sum(c[2] for c in counts.values())
    lines = [f"examples run: {passing + failing} ({passing} passing, {failing} failing; {invalid} invalid, "
             f"i.e. rejected by a filter or assume) in {len(counts)} tests",
             f"time: {seconds:.0f} s",
             f"pytest exit status: {status}",
             f"failed tests: {len(failures)}"]
    lines += [f"  {name}" for name in failures]
    lines += [f"  {name}: {c[1]} failing examples" for name, c in counts.items() if c[1] and name not in failures]
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--log", type=Path, default=Path(tempfile.gettempdir()) / "fuzz_thorough.log",
                        help="where to keep pytest's whole output")
    args, pytest_args = parser.parse_known_args(argv)
    command = COMMAND + pytest_args
    print("command:", " ".join(command[2:]), flush=True)
    start = time.perf_counter()
    with open(args.log, "w", encoding="utf-8") as log:
        status = subprocess.run(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, check=False).returncode
    seconds = time.perf_counter() - start
    text = args.log.read_text(encoding="utf-8")
    print(summary(parse_statistics(text), failed_tests(text), seconds, status))
    print(f"log: {args.log}")
    print(text.strip().splitlines()[-1] if text.strip() else "(no output)")
    return status


if __name__ == "__main__":
    sys.exit(main())
