"""The README's verification table tells the truth about where each capability was verified: a
capability marked as run on GPU hardware names a results file that exists and records that run's
date and commit, and every figure's results file holds a command, a date, a commit and a machine."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
TABLE_HEADING = "## What is verified, and where"
COLUMNS = ["capability", "CPU tests", "CPU emulation of its kernels", "NVRTC compile", "GPU hardware", "figures"]
NOT_ON_HARDWARE = ("not yet", "CPU only", "—")
DATE = re.compile(r"\b(20\d\d-\d\d-\d\d)\b")
COMMIT = re.compile(r"\bcommit ([0-9a-f]{7,40})\b")
LINK = re.compile(r"\]\((benchmarks/results/[^)#]+)\)")


def verification_table(text):
    """The rows of the table under TABLE_HEADING, as {column: cell} dicts."""
    section = text.split(TABLE_HEADING, 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    split = lambda line: [cell.strip() for cell in line.strip().strip("|").split("|")]  # noqa: E731
    header = split(lines[0])
    assert header == COLUMNS, header
    assert set(lines[1].replace("|", "").strip()) <= {"-"}
    return [dict(zip(header, split(line))) for line in lines[2:]]


def claims_hardware(cell):
    """Whether a GPU-hardware cell says the capability ran on a GPU."""
    return bool(cell) and not cell.startswith(NOT_ON_HARDWARE)


def problems_of_a_hardware_claim(cell, root=ROOT):
    """Why a GPU-hardware cell does not hold up: each run it claims (a date and a commit) must be
    recorded, with both, in a results file it links that exists."""
    if not claims_hardware(cell):
        return []
    dates, commits, links = DATE.findall(cell), COMMIT.findall(cell), LINK.findall(cell)
    found = [f"no date (YYYY-MM-DD) in {cell!r}"] if not dates else []
    found += [f"no 'commit <hash>' in {cell!r}"] if not commits else []
    found += [f"no link to benchmarks/results/ in {cell!r}"] if not links else []
    for link in links:
        path = root / link
        if not path.is_file():
            found.append(f"{link} does not exist")
            continue
        recorded = path.read_text(encoding="utf-8")
        found += [f"{link} does not record the date {d}" for d in dates if d not in recorded]
        found += [f"{link} does not record commit {c}" for c in commits if c not in recorded]
    return found


def test_the_verification_table_covers_the_gpu_capabilities():
    rows = verification_table(README.read_text(encoding="utf-8"))
    names = " ".join(row["capability"] for row in rows)
    for capability in ("tensor-core attention", "mixed precision", "CUDA graphs", "data-parallel", "explain"):
        assert capability in names, capability


def test_a_capability_marked_as_run_on_hardware_names_a_results_file_with_its_date_and_commit():
    rows = verification_table(README.read_text(encoding="utf-8"))
    assert [row["capability"] for row in rows if claims_hardware(row["GPU hardware"])]
    for row in rows:
        assert problems_of_a_hardware_claim(row["GPU hardware"]) == [], row["capability"]


@pytest.mark.parametrize("cell, problem", [
    ("all tests pass, 2026-11-30, commit 5997a78", "no link"),
    ("all tests pass, commit 5997a78 ([gpu.md](benchmarks/results/gpu.md))", "no date"),
    ("all tests pass, 2026-11-30 ([gpu.md](benchmarks/results/gpu.md))", "no 'commit"),
    ("all tests pass, 2026-11-30, commit 5997a78 ([gpu2.md](benchmarks/results/gpu2.md))", "does not exist"),
    ("all tests pass, 2026-12-24, commit 5997a78 ([gpu.md](benchmarks/results/gpu.md))", "the date 2026-12-24"),
    ("all tests pass, 2026-11-30, commit 1234567 ([gpu.md](benchmarks/results/gpu.md))", "commit 1234567"),
])
def test_an_unfounded_hardware_claim_is_caught(cell, problem):
    found = problems_of_a_hardware_claim(cell)
    assert any(problem in p for p in found), found


def results_links(page):
    """The results files a page links, repository-relative: the README links them as
    ``benchmarks/results/NAME.md``, the manual's pages (docs/) relative to themselves,
    ``../benchmarks/results/NAME.md``."""
    links = re.findall(r"\]\(([^)#\s]+)", page.read_text(encoding="utf-8"))
    resolved = {(page.parent / link).resolve() for link in links if "://" not in link}
    results = (ROOT / "benchmarks" / "results").resolve()
    return sorted(path.relative_to(ROOT).as_posix() for path in resolved if path.parent == results)


def test_every_results_file_the_readme_links_exists_and_says_how_it_was_measured():
    """Command, date, commit and machine in each results file the README or the manual links
    (the figures the README held moved into the manual with their links)."""
    pages = [README, *sorted((ROOT / "docs").rglob("*.md"))]
    linked = {link for page in pages for link in results_links(page)}
    linked = sorted(linked | set(LINK.findall(README.read_text(encoding="utf-8"))))
    assert linked and len(linked) >= 10
    for link in linked:
        path = ROOT / link
        assert path.is_file(), f"README or the manual links {link}, which does not exist"
        text = path.read_text(encoding="utf-8")
        assert re.search(r"(?i)\bcommand\b|`python ", text), f"{link}: no command"
        assert DATE.search(text), f"{link}: no date"
        assert re.search(r"\bcommit\b.{0,40}?\b[0-9a-f]{7,40}\b", text, re.S), f"{link}: no commit"
        assert re.search(r"(?i)\bcores?\b|\bCPUs?\b|H200|machine", text), f"{link}: no machine"
