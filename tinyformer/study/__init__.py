"""The study side: looking inside the engine and a trained model.

* ``gradcheck``: the gradient checker; ``gradcheck_suite`` and ``kernel_cases``: every op and
  kernel checked against central differences and its reference;
* ``viz``: the explain page, attention plots and the computation graph;
* ``course``: the exercises of ``tinyformer study``, where the reader writes the backward.

It may import every layer below it (translation included: the explain page decodes a sentence).
"""
