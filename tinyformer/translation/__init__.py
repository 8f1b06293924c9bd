"""The translation layer: a model put to work on sentences.

* ``data``: corpora, tokenizers and token-count batches; ``train``: the training loop;
* ``search``: greedy and beam search (``length_penalties``: their conventions); ``prediction``:
  ``translate``, text in and out; ``decode``: both in one namespace;
* ``checkpoint``: atomic, pickle-free checkpoints;
* ``distributed``: data parallelism over MPI or NCCL; ``metrics``: BLEU.

It imports ``model``, ``engine`` and ``common``, never the study side or the command line.
"""
