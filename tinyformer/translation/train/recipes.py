"""Recipes: named sets of TrainConfig defaults for a kind of run (``--recipe NAME``).

``TrainConfig.resolved()`` applies a recipe's values to the fields the user left unset, before the
per-data defaults; a value given explicitly wins. ``hour``: a model from one hour of a laptop's CPU
(docs/training.md#a-run-of-one-hour): a learning rate that ends at the time limit, checkpoints
every few minutes and the average of the last ones tested. Its values were chosen before the
measured runs of ``benchmarks/bench_hour.py`` (``benchmarks/results/hour.md``), not by a sweep.
"""

__all__ = ["RECIPES"]

RECIPES = {
    "hour": {
        # Minutes of training: with the BPE and data before and the end after (the averaged model's
        # validation and the test decoding) within an hour; about 15 s on Multi30k, 2 cores.
        "time_limit": 56.0,
        "schedule": "time",
        "decay_fraction": 1.0,
        "average_last": 5,
        "save_every_minutes": 2.0,
        "eval_every_minutes": 15.0,
        "eval_every": 1_000_000,      # validations by the clock only
        "max_steps": 1_000_000,       # the clock ends the run
        "warmup_steps": 400,
        "lr_factor": 0.8,             # peak 2.5e-3 for small's d_model 256 (Noam factor 1, warm-up 800: 2.2e-3)
    },
}
