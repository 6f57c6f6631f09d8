"""Benchmark mode: every strategy (and transformers' own decoders) on a prompt set.

Run ``python bench.py --help``. Pieces: prompts (built-in set, Spec-Bench
files), variants (what runs: strategies, constant gammas, gamma policies, peers),
executor (one timed decode), runner (warm-up and interleaving), aggregate (the
numbers), targets (the goal check), report/writers/chart (the outputs).
docs/benchmark.md explains it all.
"""
