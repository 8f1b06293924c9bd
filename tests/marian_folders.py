"""The Marian folders the tests share (``SHAPES``, ``marian_once``), each built once per test run.
Their makers live in the library's verification room, ``tinyformer.testing.marian_folders``
(the benchmarks use them too); the tests import them from here or from there alike."""

from tinyformer.testing.marian_folders import (corpus, hf_greedy, hf_model, make_marian_folder,  # noqa: F401
                                               write_tokenizer)


# The folders the tests share, by name: each built once per test run (``marian_once``). Every one
# translates each sentence into its own output, most of them ended by EOS well before a limit of
# some 20 tokens (tests/translation/interop/test_marian.py asserts both: with transformers' initial weights
# and random logits biases, every sentence got nearly the same output, run to the limit). The
# brief ones start from N(0, 0.1²) weights, from which 100-odd steps of Adam get that far; the
# trained one translates most sentences of the task exactly.
SHAPES = {
    # SiLU ("swish"), encoder deeper than the decoder
    "brief-swish": dict(d_model=32, encoder_layers=2, decoder_layers=1, heads=4, ffn=64, activation="swish", seed=1,
                        init_std=0.1, train_steps=100, learning_rate=5e-3),
    # GELU, decoder deeper, embeddings unscaled, trained until it translates the made-up task
    "trained-gelu": dict(d_model=32, encoder_layers=1, decoder_layers=2, heads=2, ffn=64, activation="gelu",
                         scale_embedding=False, seed=2, train_steps=400),
    # ReLU, a wider model saved as pytorch_model.bin
    "brief-relu-bin": dict(d_model=48, encoder_layers=3, decoder_layers=2, heads=4, ffn=96, activation="relu",
                           seed=3, init_std=0.1, train_steps=100, learning_rate=5e-3, safetensors=False),
}


def marian_once(tmp_path_factory, name):
    """The Marian folder ``SHAPES[name]``, built by the first process of this test run that asks for it
    (the others wait, then read it); a test that changes it copies it first."""
    from tinyformer.common.filecache import cached_product
    from trained_models import shared_directory

    return cached_product(shared_directory(tmp_path_factory), f"marian-{name}",
                          lambda partial: make_marian_folder(partial, **SHAPES[name]))
