"""The copy task shared by the decoding tests: batches, and a tiny model trained on them.

A model trained briefly to copy its source stops at varied steps, so searches over it
exercise EOS handling, the stopping rule and the length penalty (an untrained one only
repeats a token up to the length limit).
"""

import numpy as np

import tinyformer as tf
from tinyformer.engine import functional as F
from tinyformer.model import nn, optim
from tinyformer.translation.data.special import BOS_ID, EOS_ID, PAD_ID

VOCAB = 12
FIRST_WORD = 4  # ids 0-3 are PAD, UNK, BOS, EOS


def copy_batch(rng, n, low=1, high=6):
    """Source: random words + EOS; target input BOS + words; target output words + EOS."""
    lengths = rng.integers(low, high + 1, n)
    src, tgt_in, tgt_out = (np.full((n, high + 1), PAD_ID) for _ in range(3))
    for i, m in enumerate(lengths):
        words = rng.integers(FIRST_WORD, VOCAB, m)
        src[i, :m + 1] = np.append(words, EOS_ID)
        tgt_in[i, :m + 1] = np.insert(words, 0, BOS_ID)
        tgt_out[i, :m + 1] = np.append(words, EOS_ID)
    return src, tgt_in, tgt_out


def train_copy_model(steps, decay=False, **sizes):
    """A float32 ``tiny`` Transformer of ``sizes`` (d_model, d_ff, heads, num_layers, max_len)
    trained ``steps`` Adam steps on batches of 32 copy pairs, from seed 0, at a learning rate of
    3e-3; with ``decay``, falling linearly to 0 over the steps, so that the model has settled (at a
    constant rate it keeps moving: how well it copies at a given step is then the draw's)."""
    tf.manual_seed(0)
    rng = np.random.default_rng(0)
    model = nn.Transformer.from_preset("tiny", vocab_size=VOCAB, dropout=0.0, seed=0, **sizes)
    adam = optim.Adam(model.parameters(), lr=(lambda step: 3e-3 * (1 - (step - 1) / steps)) if decay else 3e-3)
    for _ in range(steps):
        src, tgt_in, tgt_out = copy_batch(rng, 32)
        loss = F.cross_entropy(model(src, tgt_in), tgt_out, ignore_index=PAD_ID)
        adam.zero_grad()
        loss.backward()
        adam.step()
    return model
