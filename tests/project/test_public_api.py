"""``import tinyformer as tf``: the names it has always had, and the short paths to a trained model.

``dir(tinyformer)`` keeps every name it held before the short paths came (issue 68, at commit
6ac33d7); ``tf.load_model``, ``tf.translate`` and ``tf.explain`` are the very functions of the
translation and study layers, imported on first use, so that ``import tinyformer`` loads neither
layer (nor sacreBLEU nor sentencepiece) for users of the engine alone.
"""

import json

import children
import pytest

import tinyformer as tf

# dir(tinyformer) at commit 6ac33d7, less the module attributes every module has (__doc__, ...)
NAMES_BEFORE = [
    "Function", "GradcheckError", "GradcheckReport", "Tensor", "__version__", "abs", "amp", "backend", "backward",
    "blas_spin", "broadcast_to", "clip", "common", "concat", "enable_grad", "engine", "exp", "filecache",
    "functional", "gelu", "grad", "gradcheck", "is_grad_enabled", "kernels", "log", "manual_seed", "masked_fill",
    "matmul", "max", "mean", "min", "model", "nn", "no_grad", "ops", "optim", "random", "relu", "reshape", "silu",
    "sqrt", "stack", "study", "sum", "swapaxes", "tanh", "tensor", "transpose", "validation", "var", "where"]

# the short path -> where the function lives (the path users wrote before)
SHORT_PATHS = {
    "load_model": ("tinyformer.translation.train", "load_model"),
    "translate": ("tinyformer.translation.decode", "translate"),
    "explain": ("tinyformer.study.viz", "explain"),
}
LAYERS_LOADED_ON_USE = ["tinyformer.translation", "tinyformer.study.viz", "sacrebleu", "sentencepiece"]


def test_dir_keeps_every_name_it_had_and_shows_the_short_paths():
    names = dir(tf)
    assert [name for name in NAMES_BEFORE if name not in names] == []
    assert [name for name in [*SHORT_PATHS, "translation"] if name not in names] == []
    assert [name for name in names if not hasattr(tf, name)] == []


@pytest.mark.parametrize("name", SHORT_PATHS)
def test_a_short_path_is_the_function_of_its_long_path(name):
    import importlib

    module, attribute = SHORT_PATHS[name]
    assert getattr(tf, name) is getattr(importlib.import_module(module), attribute)
    namespace = {}
    exec(f"from tinyformer import {name}", namespace)  # noqa: S102  (the from-import form too)
    assert namespace[name] is getattr(tf, name)


def test_a_name_tinyformer_lacks_is_an_attribute_error_naming_it():
    with pytest.raises(AttributeError, match="module 'tinyformer' has no attribute 'load_modle'"):
        tf.load_modle  # noqa: B018
    assert not hasattr(tf, "_LAZY_NOT_THERE")


def test_import_tinyformer_loads_the_translation_and_study_layers_only_on_use():
    script = ("import json, sys\nimport tinyformer as tf\nbefore = set(sys.modules)\ntf.load_model, tf.explain\n"
              f"print(json.dumps([[m in before, m in sys.modules] for m in {LAYERS_LOADED_ON_USE!r}]))\n")
    result = children.run([children.PYTHON, "-c", script])
    assert result.returncode == 0, result.stderr
    loaded = dict(zip(LAYERS_LOADED_ON_USE, json.loads(result.stdout)))
    assert loaded == {module: [False, True] for module in LAYERS_LOADED_ON_USE}
