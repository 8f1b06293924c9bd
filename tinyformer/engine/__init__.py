"""The engine: arrays on a device, reverse-mode autograd, and every operation a Transformer needs.

* ``backend``: NumPy on the CPU, CuPy on a GPU, behind one ``xp``;
* ``tensor``: ``Tensor``, ``Function`` and the backward walk; ``ops``: the elementary ops;
* ``functional``: the fused ops of the paper (attention, layer norm, softmax, cross-entropy, ...),
  each a NumPy/CuPy reference with a CUDA kernel beside it in ``kernels``;
* ``amp``: bf16/fp16 autocast; ``random``: seeded generators for initialisation and dropout.
* ``gradcheck``: does a backward agree with central differences (``tf.gradcheck``; as Chainer's
  ``gradient_check``, in the core: it needs nothing but tensors).

It imports only ``common``; nothing here knows of layers, training or translation.
"""
