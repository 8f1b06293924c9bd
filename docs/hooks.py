"""MkDocs hooks of the manual: the benchmark reports become pages of it.

The reports live in ``benchmarks/results/`` beside the scripts that write them, outside ``docs/``.
Each becomes the page ``results/NAME.md`` of the manual (read from where it is; nothing is
copied into ``docs/``), listed in the navigation under "Benchmark reports" (so a new report needs
no edit of mkdocs.yml), and a link to one, written as it works on GitHub, relative to the page's
own place in the repository (``../benchmarks/results/NAME.md`` from a page of ``docs/``), is
pointed at that page. MkDocs then checks the link as any other: under ``--strict`` a link to a
report that does not exist fails the build, and so does any other link out of ``docs/``.
"""

import posixpath
import re
from pathlib import Path

from mkdocs.structure.files import File, InclusionLevel
from mkdocs.structure.nav import Section

RESULTS = "benchmarks/results"  # repository-relative
PAGES = "results"  # where the reports go in the manual
LINK = re.compile(r"(\]\()([^)\s#]+)")  # an inline link's target, up to an anchor or a title


def _repository(config):
    return Path(config.config_file_path).resolve().parent


def on_files(files, config):
    """Add every report of benchmarks/results/ as a page of the manual."""
    for path in sorted((_repository(config) / RESULTS).glob("*.md")):
        files.append(File.generated(config, f"{PAGES}/{path.name}", abs_src_path=str(path),
                                    inclusion=InclusionLevel.NOT_IN_NAV))  # on_nav places them
    return files


def on_nav(nav, config, files):
    """The reports, in the order of their names, as the navigation's last section."""
    reports = [file.page for file in files.documentation_pages() if file.src_uri.startswith(f"{PAGES}/")]
    section = Section("Benchmark reports", reports)
    for page in reports:
        page.parent, page.title = section, posixpath.basename(page.file.src_uri)  # short: gpu.md
    nav.items.append(section)
    return nav


def on_page_markdown(markdown, page, config, files):
    """Point the page's links to benchmarks/results/*.md at the reports' pages."""
    repository = _repository(config)
    source = Path(page.file.abs_src_path).resolve()
    if not source.is_relative_to(repository):
        return markdown
    here = posixpath.dirname(source.relative_to(repository).as_posix())  # e.g. "docs"
    in_manual = posixpath.dirname(page.file.src_uri)  # the page's folder in the manual

    def point(match):
        target = match.group(2)
        if "://" in target or target.startswith(("/", "mailto:")):
            return match.group(0)
        in_repository = posixpath.normpath(posixpath.join(here, target))
        folder, name = posixpath.split(in_repository)
        if folder != RESULTS or not name.endswith(".md"):
            return match.group(0)
        return match.group(1) + posixpath.relpath(f"{PAGES}/{name}", in_manual or ".")

    return LINK.sub(point, markdown)
