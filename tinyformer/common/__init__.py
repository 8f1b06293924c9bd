"""The bottom layer: what every other layer may use and which knows nothing of arrays or models.

* ``validation``: argument checks that raise one-line errors naming the argument;
* ``atomic``: writing a file so that a reader sees the old one or the new one, never a part;
* ``filecache``: a per-user cache folder (compiled kernels, prepared corpora);
* ``version``: tinyformer's version;
* ``blas_spin``: OpenBLAS's idle threads sleep at once (set before NumPy loads it).
"""
