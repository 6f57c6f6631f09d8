"""Benchmark mode: every strategy (and transformers' own decoders) on a prompt set.

Run ``python bench.py --help``; docs/benchmark.md explains it all.
"""
