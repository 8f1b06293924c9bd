"""Pictures for studying the model: attention heatmaps, the learning-rate schedule and training
curves (``plots``, needs the ``plot`` extra), the computation graph of a Tensor as Graphviz DOT
(``dot``), and ``explain``: one offline HTML page with a sentence's attention and its gradients
(an ``ExplainPage``: a str that a Jupyter notebook shows inline and ``save`` writes)."""

from .dot import RENDER_FORMATS, GraphvizMissing, render_dot, to_dot
from .explain_page import ExplainPage
from .explanation import SCHEMA, explain, explain_data, explain_steps, explain_steps_data
from .plots import (
    ATTENTION_KINDS,
    CURVES_INCHES,
    DPI,
    PLOT_EXTRA_HINT,
    SCHEDULE_INCHES,
    PlotExtraMissing,
    attention_figure_size,
    attention_maps,
    plot_attention,
    plot_curves,
    plot_schedule,
    read_metrics,
    require_matplotlib,
)

__all__ = [
    "PlotExtraMissing", "GraphvizMissing", "DPI", "require_matplotlib", "attention_maps", "plot_attention",
    "attention_figure_size", "plot_schedule", "read_metrics", "plot_curves", "to_dot", "render_dot",
    "explain", "explain_data", "explain_steps", "explain_steps_data", "SCHEMA", "ExplainPage",
]
