"""Why a run was as fast as it was: acceptance statistics and the speedup model.

Torch-free on purpose: ``infer.py --replay`` reads a saved trace and shows the
same numbers without loading torch or a model.
"""
