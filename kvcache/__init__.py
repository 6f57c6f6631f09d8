"""The KV-cache core: a model and its cache through one generation (``cache``), the probe that
decides how each model may be fed over its cache (``probe``), and prompt prefills shared by many
generations (``prefill``).

``cache`` imports neither of the other two: ``probe`` and ``prefill`` build on it. Model loading
lives in ``utils``; nothing here loads a model.
"""
