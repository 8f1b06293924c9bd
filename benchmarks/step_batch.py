"""The step benchmark's batch: seeded sentence pairs of about ``tokens`` target tokens, with the
package's special ids (``tinyformer.translation.data.special``) and its label smoothing.

Shared by ``bench_step.py``, ``bench_ddp.py``, ``launch_count.py`` and ``profile_step.py``, so that
every step they time is the same step.
"""

import tinyformer  # noqa: F401  first: its OpenBLAS setting (common/blas_spin.py) must precede NumPy
import numpy

from tinyformer.translation.data.special import BOS_ID, EOS_ID, PAD_ID, SPECIAL_IDS

PAD, BOS, EOS = PAD_ID, BOS_ID, EOS_ID
FIRST_WORD = len(SPECIAL_IDS)  # real words are drawn from [FIRST_WORD, vocab): no special id among them
LABEL_SMOOTHING = 0.1  # §5.4, as `tinyformer train` (TrainConfig.label_smoothing)


def make_batch(tokens, length, vocab, seed):
    """Sentence pairs padded to ``length``, rows added until the target holds ``tokens`` tokens.

    Source and target lengths are drawn uniformly from [length - length // 4, length] (a
    length-bucketed batch, as a token-based batcher builds); the last row's target is cut so the
    count is exact. A target of n tokens (words plus EOS) gives tgt_in = BOS w1 .. w(n-1) and
    tgt_out = w1 .. w(n-1) EOS; the target token count is the number of non-pad tgt_out positions
    (fairseq's ``ntokens``).
    """
    if vocab <= FIRST_WORD:
        raise SystemExit(f"--vocab must be at least {FIRST_WORD + 1} ({', '.join(SPECIAL_IDS)} and one word)")
    rng = numpy.random.default_rng(seed)
    low = max(1, length - length // 4)
    src_lens, tgt_lens, total = [], [], 0
    while total < tokens:
        n = min(int(rng.integers(low, length + 1)), tokens - total)
        src_lens.append(int(rng.integers(low, length + 1)))
        tgt_lens.append(n)
        total += n
    rows = len(tgt_lens)
    src = numpy.full((rows, length), PAD, dtype=numpy.int64)
    tgt_in = numpy.full((rows, length), PAD, dtype=numpy.int64)
    tgt_out = numpy.full((rows, length), PAD, dtype=numpy.int64)
    for i, (s, n) in enumerate(zip(src_lens, tgt_lens)):
        src[i, :s] = rng.integers(FIRST_WORD, vocab, s)
        words = rng.integers(FIRST_WORD, vocab, n - 1)
        tgt_in[i, 0], tgt_in[i, 1:n] = BOS, words
        tgt_out[i, :n - 1], tgt_out[i, n - 1] = words, EOS
    return {"src": src, "tgt_in": tgt_in, "tgt_out": tgt_out,
            "tgt_tokens": int((tgt_out != PAD).sum()), "src_tokens": int((src != PAD).sum())}


def model_flops(config, params, batch):
    """FLOPs of one training step: 6 · parameters · tokens plus attention.

    tokens: the target tokens (fairseq's ntokens). Attention adds, per layer and forward
    pass, 4·rows·len_q·len_k·d_model (QKᵀ and PV over all heads), three times that for forward
    plus backward: encoder self (src × src), decoder self (tgt × tgt) and cross (tgt × src),
    on the padded lengths.
    """
    rows, len_src = batch["src"].shape
    len_tgt = batch["tgt_in"].shape[1]
    d, layers = config["d_model"], config["num_layers"]
    pairs = layers * (len_src * len_src + len_tgt * len_tgt + len_tgt * len_src)
    return 6 * params * batch["tgt_tokens"] + 3 * 4 * rows * pairs * d
