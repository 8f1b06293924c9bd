"""Named model sizes: the paper's Table 3 rows and two small ones for Multi30k and tests."""

import inspect

__all__ = ["PRESETS", "preset_config"]

PRESETS = {
    # Table 3, "base": 65 M parameters with a shared 37k vocabulary.
    "base": dict(num_layers=6, d_model=512, d_ff=2048, heads=8, dropout=0.1, label_smoothing=0.1),
    # Table 3, "big": 213 M parameters.
    "big": dict(num_layers=6, d_model=1024, d_ff=4096, heads=16, dropout=0.3, label_smoothing=0.1),
    # Multi30k-sized (29k sentence pairs): trains on one GPU in minutes.
    "small": dict(num_layers=3, d_model=256, d_ff=1024, heads=4, dropout=0.1, label_smoothing=0.1),
    # Tests and the built-in synthetic task: trains on a CPU in seconds.
    "tiny": dict(num_layers=2, d_model=64, d_ff=256, heads=4, dropout=0.1, label_smoothing=0.1),
}


def preset_config(name, vocab_size=None, **overrides):
    """Transformer keyword arguments for preset ``name`` with ``overrides`` applied.

    ``vocab_size`` sets a shared vocabulary; pass ``src_vocab_size`` and
    ``tgt_vocab_size`` instead for separate ones.
    """
    from .transformer import Transformer

    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; known presets: {', '.join(PRESETS)}")
    allowed = set(inspect.signature(Transformer.__init__).parameters) - {"self"}
    unknown = sorted(set(overrides) - allowed)
    if unknown:
        raise TypeError(f"preset {name!r}: unknown Transformer arguments {unknown}; "
                        f"allowed: {sorted(allowed)}")
    config = dict(PRESETS[name])
    if vocab_size is not None:
        if "src_vocab_size" in overrides or "tgt_vocab_size" in overrides:
            raise TypeError("give either vocab_size (shared) or src_vocab_size/tgt_vocab_size, not both")
        config["src_vocab_size"] = vocab_size
    config.update(overrides)
    if "src_vocab_size" not in config:
        raise TypeError(f"preset {name!r} needs vocab_size (or src_vocab_size)")
    return config
