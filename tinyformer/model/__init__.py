"""The model layer: the Transformer's modules (``nn``) and what trains their parameters
(``optim``: Adam, the warm-up schedule, loss scaling). It imports only ``engine`` and ``common``."""
