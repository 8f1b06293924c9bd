"""examples/notebook.ipynb, the notebook students open in Colab, Kaggle or Jupyter, run headless
on the CPU with nbclient (fewer steps: its ``parameters`` cell replaced), so that it never rots:
install (nothing: tinyformer imports), the machine, training, the loss plot, translations, the
explain page inline and one study exercise."""

import re
from pathlib import Path

import children
from tests.study.test_explain_notebook import notebook_tools, the_iframe, this_python_kernel  # noqa: F401 (a fixture)

import tinyformer

NOTEBOOK = Path(__file__).resolve().parents[2] / "examples" / "notebook.ipynb"
SHORT = 'STEPS = 30\nEVAL_EVERY = 30\nSAVE_DIR = "runs/notebook"'


def test_the_notebook_is_stored_without_outputs(notebook_tools):
    nbformat, _ = notebook_tools
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(notebook)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code and all(cell.outputs == [] and cell.execution_count is None for cell in code)
    [parameters] = [cell for cell in code if "parameters" in cell.metadata.get("tags", [])]
    assert [line.split(" =")[0] for line in parameters.source.splitlines()] == ["STEPS", "EVAL_EVERY", "SAVE_DIR"]


def _text(cell):
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")


def test_the_notebook_runs_headless_on_the_cpu(notebook_tools, tmp_path, monkeypatch):
    nbformat, nbclient = notebook_tools
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    [parameters] = [c for c in notebook.cells if "parameters" in c.metadata.get("tags", [])]
    parameters.source = SHORT
    folder = tmp_path / "work"
    folder.mkdir()
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    monkeypatch.setenv("JUPYTER_PLATFORM_DIRS", "1")
    env = children.child_env({"IPYTHONDIR": str(tmp_path / "ipython"), "JUPYTER_PLATFORM_DIRS": "1",
                              "MPLBACKEND": "module://matplotlib_inline.backend_inline"})
    client = nbclient.NotebookClient(notebook, km=this_python_kernel(tmp_path / "kernels"), timeout=600,
                                     startup_timeout=60, resources={"metadata": {"path": str(folder)}})
    client.execute(env=env, cleanup_kc=True)  # raises CellExecutionError, with the traceback, if a cell fails
    code = [c for c in notebook.cells if c.cell_type == "code"]
    install, _, machine, train, plot, translated, explain, exercise, check = code

    assert _text(install).strip() == f"tinyformer {tinyformer.__version__} from {tinyformer.__file__}"
    assert "GPU available (cupy.is_available()): False" in _text(machine)
    assert _text(machine).strip().endswith("this notebook trains on cpu in fp32")
    log = _text(train)
    assert "device cpu, precision fp32: NumPy ops on the CPU" in log
    assert re.search(r"step 30: validation loss \d+\.\d+, greedy BLEU", log), log
    assert any("image/png" in o.get("data", {}) for o in plot.outputs)  # the loss curve, drawn inline
    lines = _text(translated).strip().splitlines()
    assert [line.split("  ->  ")[0] for line in lines] == ["I see 3 red cats", "You want 970 old flowers",
                                                           "We buy 12 small dogs"]
    [shown] = [o for o in explain.outputs if o.output_type == "execute_result"]
    assert 'id="explain-data"' in the_iframe(shown.data["text/html"])["srcdoc"]
    assert "Exercise 2 of `tinyformer study`: softmax" in _text(exercise)
    checked = _text(check)  # the notebook's first try: the diagonal of the Jacobian alone
    assert "02_softmax.py: exercise 2, softmax: not right yet — dx is wrong" in checked
    assert "what it looks like: no row sum subtracted" in checked
    assert (folder / "runs" / "notebook" / "metrics.jsonl").is_file() and (folder / "course" / "02_softmax.py").is_file()
