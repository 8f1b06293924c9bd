"""Fixtures of the project-wide tests."""

import pytest

from tinyformer.translation.data.synthetic import synthetic_pairs
from tinyformer.translation.data.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    """A joint BPE of 150 pieces over the built-in task's validation split (the tokenizer of
    ``trained_models.make_tiny_run``'s runs), one per module."""
    english, german = synthetic_pairs("val")
    return Tokenizer.train(english + german, tmp_path_factory.mktemp("tok"), vocab_size=150)
