"""Marian model folders made here, as transformers saves them (there is no network): two sentencepiece
models trained on a made-up parallel corpus, a shared ``vocab.json`` over their pieces, and a
``MarianMTModel`` of a chosen shape with random (and, if asked, briefly trained) weights.

The corpus: source sentences of 3 to 9 words drawn from a small English-like word list; the target
is each word's "translation" (a fixed word of another list) in the same order, the sentence ending
in a period. A few hundred steps of Adam learn much of it, so a trained model translates most
sentences into something other than its maximum length of nonsense.

Verification machinery (it needs the test extra's transformers and torch, and sentencepiece): the
tests build their shared folders with it (tests/marian_folders.py), the benchmarks their
opus-mt-shaped ones (benchmarks/bench_marian.py, bench_explain.py).
"""

import io
import json
import random
from pathlib import Path

SOURCE_WORDS = ("the cat dog man woman child house tree car street red blue green small big runs sits sees "
                "reads plays eats water book ball park garden near under over and with").split()
TARGET_WORDS = ("die katze hund mann frau kind haus baum auto strasse rot blau gruen klein gross rennt sitzt "
                "sieht liest spielt isst wasser buch ball park garten nahe unter ueber und mit").split()
LEXICON = dict(zip(SOURCE_WORDS, TARGET_WORDS))


def corpus(count, seed=0):
    """``count`` (source, target) sentence pairs of the made-up task."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(count):
        words = [rng.choice(SOURCE_WORDS) for _ in range(rng.randint(3, 9))]
        pairs.append((" ".join(words) + ".", " ".join(LEXICON[w] for w in words) + "."))
    return pairs


def _sentencepiece(texts, vocab_size):
    import sentencepiece

    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(texts), model_writer=model, vocab_size=vocab_size, model_type="unigram",
        hard_vocab_limit=False, minloglevel=2, unk_id=0, bos_id=-1, eos_id=1, pad_id=-1, num_threads=1)
    return model.getvalue()


def write_tokenizer(folder, pairs, vocab_size=120):
    """source.spm, target.spm (Marian's: unk 0, eos 1, no bos or pad) and vocab.json: "</s>" 0, "<unk>" 1,
    then every other piece of both models, "<pad>" last. Returns the vocabulary."""
    import sentencepiece

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    vocab = {"</s>": 0, "<unk>": 1}
    for name, texts in (("source.spm", [s for s, _ in pairs]), ("target.spm", [t for _, t in pairs])):
        data = _sentencepiece(texts, vocab_size)
        (folder / name).write_bytes(data)
        processor = sentencepiece.SentencePieceProcessor(model_proto=data)
        for i in range(processor.get_piece_size()):
            if not (processor.is_control(i) or processor.is_unknown(i)):
                vocab.setdefault(processor.id_to_piece(i), len(vocab))
    vocab["<pad>"] = len(vocab)
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    return vocab


def make_marian_folder(folder, *, d_model=32, encoder_layers=2, decoder_layers=1, heads=4, ffn=64,
                       activation="swish", scale_embedding=True, seed=0, train_steps=0, learning_rate=1e-2,
                       init_std=None, pairs=None, max_positions=128, safetensors=True):
    """A Marian folder at ``folder`` as ``save_pretrained`` writes it; returns (folder, the torch model,
    transformers' MarianTokenizer). ``init_std``: every weight matrix but the positions' drawn from
    N(0, init_std²) instead of transformers' N(0, 0.02²); ``train_steps`` > 0: that many Adam steps
    (``learning_rate``) on the made-up corpus."""
    import torch
    from transformers import MarianConfig, MarianMTModel, MarianTokenizer

    folder = Path(folder)
    pairs = pairs if pairs is not None else corpus(600, seed)
    vocab = write_tokenizer(folder, pairs)
    tokenizer = MarianTokenizer(str(folder / "source.spm"), str(folder / "target.spm"), str(folder / "vocab.json"))
    pad = vocab["<pad>"]
    config = MarianConfig(
        vocab_size=len(vocab), d_model=d_model, encoder_layers=encoder_layers, decoder_layers=decoder_layers,
        encoder_attention_heads=heads, decoder_attention_heads=heads, encoder_ffn_dim=ffn, decoder_ffn_dim=ffn,
        max_position_embeddings=max_positions, pad_token_id=pad, decoder_start_token_id=pad, eos_token_id=0,
        forced_eos_token_id=0, activation_function=activation, scale_embedding=scale_embedding, dropout=0.1)
    torch.manual_seed(seed)
    model = MarianMTModel(config)
    with torch.no_grad():  # a bias on the logits that is not zero, so that its import is checked
        model.final_logits_bias.normal_(0, 0.5)
        if init_std is not None:
            for name, parameter in model.named_parameters():
                if parameter.dim() == 2 and "embed_positions" not in name:
                    parameter.normal_(0, init_std)
    if train_steps:
        _train(model, tokenizer, pairs, train_steps, learning_rate, seed)
    model.eval()
    model.generation_config.bad_words_ids = [[pad]]
    model.save_pretrained(str(folder), safe_serialization=safetensors)
    tokenizer.save_pretrained(str(folder))
    return folder, model, tokenizer


def _train(model, tokenizer, pairs, steps, learning_rate, seed):
    import torch

    rng = random.Random(seed)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # beside the other test processes, more threads only wait for each other
    try:
        _steps(model, tokenizer, pairs, steps, learning_rate, rng)
    finally:
        torch.set_num_threads(threads)


def _steps(model, tokenizer, pairs, steps, learning_rate, rng):
    import torch

    optimiser = torch.optim.Adam(model.parameters(), lr=learning_rate)
    model.train()
    for _ in range(steps):
        batch = rng.sample(pairs, 32)
        inputs = tokenizer([s for s, _ in batch], text_target=[t for _, t in batch], return_tensors="pt",
                           padding=True)
        inputs["labels"][inputs["labels"] == tokenizer.pad_token_id] = -100
        loss = model(**inputs).loss
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()


def hf_model(folder):
    """transformers' (MarianMTModel in eval mode, MarianTokenizer) of ``folder``."""
    from transformers import MarianMTModel, MarianTokenizer

    return MarianMTModel.from_pretrained(str(folder)).eval(), MarianTokenizer.from_pretrained(str(folder))


def hf_greedy(model, tokenizer, sentences, max_new_tokens):
    """transformers' greedy translations of ``sentences`` as token ids, without the decoder's start token,
    the padding and the final EOS (tinyformer's Hypothesis tokens)."""
    import torch

    inputs = tokenizer(sentences, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(**inputs, num_beams=1, do_sample=False, max_new_tokens=max_new_tokens,
                             bad_words_ids=[[tokenizer.pad_token_id]])
    rows = []
    for row in out.tolist():
        row = row[1:]
        while row and row[-1] == tokenizer.pad_token_id:
            row.pop()
        rows.append(row[:-1] if row and row[-1] == tokenizer.eos_token_id else row)
    return rows
