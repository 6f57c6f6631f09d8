"""Benchmark mode: every strategy (and transformers' own decoders) on a prompt set.

Run ``python bench.py --help``. Pieces: prompts (built-in set, Spec-Bench
files), variants (what runs), executor (one timed decode), runner (warm-up and
interleaving), aggregate (the numbers), report/writers/chart (the outputs).
"""
