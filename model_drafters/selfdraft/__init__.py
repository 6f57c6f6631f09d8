"""Self-drafters: drafters made from the target itself (no second model to download).

``self:bf16`` / ``self:fp16`` (a copy in a lower precision), ``self:int8`` (the
target's linear weights quantised to int8) and ``self:skip=L1,L2,...`` or
``self:skip=auto`` (the target with some layers skipped, sharing its weights;
Draft&Verify, Zhang et al. 2023; SWIFT, Xia et al. 2024). Each is a model the
engine drafts with like any drafter model, and, where the cache layout allows,
it reads the target's own KV cache for the committed tokens (``shared_cache``).
With no ``--drafter`` on the default model the loader (``engine.self_pair.load``,
called through ``engine.load_pair``) picks among them by measuring (``engine.self_pair.choose``).
"""
