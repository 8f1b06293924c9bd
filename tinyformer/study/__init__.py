"""The study side: looking inside the engine and a trained model.

* ``viz``: the explain page, attention plots and the computation graph;
* ``course``: the exercises of ``tinyformer study``, where the reader writes the backward.

It may import every layer below it (translation included: the explain page decodes a sentence).
The gradient checker is the engine's (``tinyformer.engine.gradcheck``); the checks of the library
itself (the gradcheck suite, the kernels' cases, their CPU emulation) are ``tinyformer.testing``.
"""
