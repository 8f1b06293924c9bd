"""The verification room: what checks tinyformer, shipped with it but used by none of its layers."""
