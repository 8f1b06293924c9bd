"""The explain page in a Jupyter notebook: ``ExplainPage``, the str that Jupyter shows in a
sandboxed iframe and ``save`` writes atomically, and a notebook that makes, shows and saves a
page, run headless with nbclient on an ipykernel kernel of the Python running the tests."""

import json
import os
import re
import sys
from html.parser import HTMLParser
from pathlib import Path

import children
import pytest

import tinyformer
from ci import in_ci
from tinyformer.study import viz
from tinyformer.study.viz import ExplainPage

SOURCE = "I see 3 red cats"
# A page in small, with every character that html.escape changes, an address and non-ASCII text.
SMALL_PAGE = ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>tinyformer explain: a &amp; "
              "&quot;b&quot;</title></head>\n<body><p class=\"x\" data-v='1'>&lt;tag&gt; &amp; \"quoted\" "
              "'single' http&#58;//example.org — Größe</p></body></html>\n")


class Iframes(HTMLParser):
    """The attributes of each <iframe> of an HTML text, their values unescaped as a browser reads them."""

    def __init__(self, text):
        super().__init__(convert_charrefs=True)
        self.found = []
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        if tag == "iframe":
            self.found.append(dict(attrs))


def the_iframe(text):
    frames = Iframes(text).found
    assert len(frames) == 1, text[:300]
    return frames[0]


# ---------------------------------------------------------------- ExplainPage
def test_jupyter_shows_the_whole_page_in_a_sandboxed_iframe():
    page = ExplainPage(SMALL_PAGE)
    shown = page._repr_html_()
    frame = the_iframe(shown)
    assert frame["srcdoc"] == SMALL_PAGE  # the page exactly, once unescaped
    assert shown.count("<") == 2 and shown.endswith("></iframe>")  # nothing of the page is markup here
    assert sorted(frame["sandbox"].split()) == ["allow-downloads", "allow-scripts"]  # no same-origin
    assert frame["title"] == 'tinyformer explain: a & "b"'
    assert "width: 100%" in frame["style"] and "height: 900px" in frame["style"]


def test_the_page_is_still_the_str_it_was():
    page = ExplainPage(SMALL_PAGE)
    assert isinstance(page, str) and page == SMALL_PAGE and hash(page) == hash(SMALL_PAGE)
    assert "Größe" in page and page.encode("utf-8") == SMALL_PAGE.encode("utf-8")
    assert type(page + "") is str  # str's methods give plain strings, as before


def spy_on_replace(monkeypatch):
    """The (source, target) of every os.replace, with the target's bytes just before it."""
    calls, replace = [], os.replace

    def spy(source, target):
        target = Path(target)
        calls.append((Path(source), target, target.read_bytes() if target.exists() else None))
        replace(source, target)

    monkeypatch.setattr(os, "replace", spy)
    return calls


@pytest.mark.parametrize("as_text", [False, True], ids=["Path", "str"])
def test_save_writes_the_page_atomically_and_returns_its_path(tmp_path, monkeypatch, as_text):
    target = tmp_path / "page.html"
    target.write_text("an older page", encoding="utf-8")
    calls = spy_on_replace(monkeypatch)
    saved = ExplainPage(SMALL_PAGE).save(str(target) if as_text else target)
    assert isinstance(saved, Path) and saved == target
    assert target.read_bytes() == SMALL_PAGE.encode("utf-8")
    # Written whole to a temporary file in the same folder, then renamed over the older page.
    [(source, renamed, before)] = calls
    assert renamed == target and source.parent == tmp_path and source != target and before == b"an older page"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["page.html"]


def test_a_failed_save_keeps_the_older_page_and_leaves_no_temporary(tmp_path, monkeypatch):
    target = tmp_path / "page.html"
    target.write_text("an older page", encoding="utf-8")

    def fail(source, target):
        raise OSError("no space left on device")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="no space"):
        ExplainPage(SMALL_PAGE).save(target)
    assert target.read_text(encoding="utf-8") == "an older page"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["page.html"]


@pytest.mark.parametrize("where, error, words", [
    ("no/page.html", FileNotFoundError, "the folder"),
    ("folder", IsADirectoryError, "is a folder"),
])
def test_a_bad_path_is_one_line_naming_it(tmp_path, where, error, words):
    (tmp_path / "folder").mkdir()
    path = tmp_path / where
    with pytest.raises(error) as raised:
        ExplainPage(SMALL_PAGE).save(path)
    message = str(raised.value)
    assert "\n" not in message and str(path) in message and words in message, message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder"] and not any((tmp_path / "folder").iterdir())


# ---------------------------------------------------------------- a notebook, run headless
@pytest.fixture(scope="session")  # session: set up before the trained model, so a skip costs no training
def notebook_tools():
    """nbformat and nbclient; skipped without them or ipykernel (the test extra has them: CI fails instead)."""
    try:
        import ipykernel.kernelspec  # noqa: F401
        import jupyter_client  # noqa: F401
        import nbclient
        import nbformat
    except ImportError as error:
        reason = (f"the notebook test needs nbclient, nbformat and ipykernel (the test extra): {error.name} is "
                  "missing; pip install -e '.[test]'")
        if in_ci():
            pytest.fail(reason)
        pytest.skip(reason)
    return nbformat, nbclient


def this_python_kernel(directory):
    """A kernel manager whose one kernel, "python3", is ipykernel on sys.executable, whatever kernels
    the machine has installed (a user's "python3" may run another Python)."""
    from ipykernel.kernelspec import write_kernel_spec
    from jupyter_client import AsyncKernelManager
    from jupyter_client.kernelspec import KernelSpecManager

    write_kernel_spec(directory / "python3")
    return AsyncKernelManager(kernel_name="python3", kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(directory)]))


def test_a_notebook_shows_the_page_and_saves_it(notebook_tools, trained_synthetic, tmp_path, monkeypatch):
    nbformat, nbclient = notebook_tools
    folder = tmp_path / "notebook"
    folder.mkdir()
    cells = [
        "import sys\nimport tinyformer\nprint(sys.executable)\nprint(tinyformer.__file__)",
        f"model, tokenizer, _ = tinyformer.load_model({str(trained_synthetic.checkpoint)!r})",  # the short paths
        f"page = tinyformer.explain(model, tokenizer, {SOURCE!r})\npage",
        'saved = page.save("page.html")\nprint(saved.resolve())',
    ]
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(cell) for cell in cells])
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    # The connection file, IPython's profile and Jupyter's paths in the test's folder, not the home's;
    # the kernel gets the children's clean environment, this checkout first on PYTHONPATH.
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    monkeypatch.setenv("JUPYTER_PLATFORM_DIRS", "1")
    env = children.child_env({"IPYTHONDIR": str(tmp_path / "ipython"), "JUPYTER_PLATFORM_DIRS": "1"})
    client = nbclient.NotebookClient(notebook, km=this_python_kernel(tmp_path / "kernels"), timeout=120,
                                     startup_timeout=60, resources={"metadata": {"path": str(folder)}})
    client.execute(env=env, cleanup_kc=True)  # raises CellExecutionError, with the traceback, if a cell fails
    nbformat.validate(notebook)

    started = notebook.cells[0].outputs[0]["text"].splitlines()
    assert started == [sys.executable, tinyformer.__file__]  # this Python, this checkout
    [shown] = [output for output in notebook.cells[2].outputs if output.output_type == "execute_result"]
    page = the_iframe(shown.data["text/html"])["srcdoc"]
    assert '<meta http-equiv="Content-Security-Policy"' in page and 'id="explain-data"' in page
    data = re.search(r'<script type="application/json" id="explain-data">(.*?)</script>', page, re.S).group(1)
    assert json.loads(data)["source"]["text"] == SOURCE
    plain = shown.data["text/plain"]
    assert plain.startswith("<ExplainPage") and "\n" not in plain and len(plain) < 200  # not a second copy
    saved = folder / "page.html"
    assert notebook.cells[3].outputs[0]["text"].strip() == str(saved.resolve())
    assert saved.read_text(encoding="utf-8") == page
    assert page == viz.explain(*trained_synthetic.load(), SOURCE)  # the page the library makes here
