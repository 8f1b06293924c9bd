"""Profile training steps with pyinstrument and print where the time goes.

    python benchmarks/profile_step.py [--preset small] [--steps 3] [--top 25] [--device cpu|cuda]

Builds the same model and batch as bench_step.py (4,096 target tokens, vocabulary 8,000),
runs one warm-up step, then profiles ``--steps`` steps and prints the functions with the
most self time (flat), followed by the call tree down to the fused ops. Needs the `bench`
extra's pyinstrument. On cuda the GPU runs asynchronously: the profile is the host's time,
and a step ends with a device synchronisation, so time spent waiting for the GPU shows up
where the host first waits for it.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import provenance  # noqa: E402
from step_batch import make_batch  # noqa: E402
from step_runners import TinyformerRunner  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--top", type=int, default=25, help="lines of the flat profile")
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = parser.parse_args(argv)
    try:
        from pyinstrument import Profiler
        from pyinstrument.renderers import ConsoleRenderer
    except ImportError:
        parser.error("needs pyinstrument: pip install -e '.[bench]'")

    batch = make_batch(args.tokens, 32, args.vocab, 0)
    runner = TinyformerRunner(args.preset, args.vocab, batch, args.device, 0)
    runner.step()
    profiler = Profiler(interval=0.01)
    profiler.start()
    for _ in range(args.steps):
        runner.step()
    session = profiler.stop()
    print(f"command: {provenance.command_line()}")
    print(f"{args.preset}: {args.steps} steps of {batch['tgt_tokens']:,} target tokens, "
          f"{session.duration / args.steps:.3f} s per step while profiled")
    flat = profiler.output(ConsoleRenderer(flat=True, unicode=False, color=False))
    print("\n".join(flat.splitlines()[: args.top + 6]))


if __name__ == "__main__":
    main()
