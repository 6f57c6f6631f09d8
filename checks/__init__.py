"""Checks a user can run on a loaded model pair (``infer.py --selftest``, ``/selftest``).

Imported lazily by the REPL: ``checks.selftest`` needs torch, this package does not.
"""
