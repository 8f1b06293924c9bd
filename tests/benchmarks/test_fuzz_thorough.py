"""benchmarks/fuzz_thorough.py and the thorough hypothesis profile: the statistics are counted
right, and under the profile a test runs ten times the examples its own settings ask for."""

from pathlib import Path

import children
from hypothesis import given, settings
from hypothesis import strategies as st
from scripts import load_script

fuzz = load_script("benchmarks/fuzz_thorough.py")

counts = st.tuples(*[st.integers(0, 10**6)] * 3)
# tests/test_[a-z_]{1,12}\.py::test_[a-z_]{1,12}(\[[a-z0-9. -]{1,8}\])?, built from its parts (st.from_regex
# spends most of the test's time generating them)
names = st.text("abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=12)
parameters = st.text("abcdefghijklmnopqrstuvwxyz0123456789. -", min_size=1, max_size=8).map("[{}]".format)
test_ids = st.builds("tests/test_{}.py::test_{}{}".format, names, names, st.just("") | parameters)
PHASES = ("reuse", "generate", "shrink")


def statistics_text(tests):
    """What ``--hypothesis-show-statistics`` prints for {test id: [(passing, failing, invalid) per phase]}."""
    blocks = ["============================ Hypothesis Statistics ============================="]
    for name, phases in tests.items():
        lines = [f"{name}:", ""]
        for phase, (passing, failing, invalid) in zip(PHASES, phases):
            lines += [f"  - during {phase} phase (0.20 seconds):",
                      "    - Typical runtimes: ~ 1-3 ms, of which ~ 0-1 ms in data generation",
                      f"    - {passing} passing, {failing} failing, and {invalid} invalid test cases", ""]
        lines += ["  - Stopped because settings.max_examples=60", "", ""]
        blocks.append("\n".join(lines))
    return "\n".join(blocks) + "\nFAILED tests/test_a.py::test_b - AssertionError: 1 != 2\n1 failed, 3 passed in 2.00s\n"


EXAMPLES = 7


@settings(max_examples=EXAMPLES, deadline=None)
@given(tests=st.dictionaries(test_ids, st.lists(counts, min_size=1, max_size=3), max_size=6))
def test_statistics_are_summed_per_test_over_the_phases(tests):
    parsed = fuzz.parse_statistics(statistics_text(tests))
    assert parsed == {name: [sum(phase[i] for phase in phases) for i in range(3)] for name, phases in tests.items()}
    assert fuzz.failed_tests(statistics_text(tests)) == ["tests/test_a.py::test_b"]


def test_the_thorough_profile_runs_ten_times_a_tests_own_examples(tmp_path):
    test = f"tests/benchmarks/{Path(__file__).name}::test_statistics_are_summed_per_test_over_the_phases"
    result = children.run([children.PYTHON, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", test,
                           "--hypothesis-profile=thorough", "--hypothesis-show-statistics"],
                          env={"HYPOTHESIS_STORAGE_DIRECTORY": str(tmp_path)}, timeout=300)  # nothing to replay
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (name, (passing, failing, _)), = fuzz.parse_statistics(result.stdout).items()
    assert (name, passing, failing) == (test, 10 * EXAMPLES, 0), result.stdout[-3000:]
