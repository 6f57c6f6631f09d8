"""Self-drafters: drafters made from the target itself (no second model to download).

``self:bf16`` / ``self:fp16`` (a copy in a lower precision), ``self:int8`` (the
target's linear weights quantised to int8) and ``self:skip=L1,L2,...`` or
``self:skip=auto`` (the target with some layers skipped, sharing its weights;
Draft&Verify, Zhang et al. 2023; SWIFT, Xia et al. 2024). Each is a model the
engine drafts with like any drafter model, and, where the cache layout allows,
it reads the target's own KV cache for the committed tokens (``kvcache.shared``).
With no ``--drafter`` on the default model the loader (``load``, called through
``engine.load_pair`` with the engine's greedy run to decode with) picks among them by measuring
(``calibrate``, ``search``, ``choose``, ``default``).

Code outside the package reaches it through its kind (``kind.KIND``) and the names below, imported
lazily so importing the package stays cheap.
"""

from model_drafters.exports import lazy_exports

_EXPORTS = {
    "INT8_ROUTES": "model_drafters.selfdraft.spec",
    "SelfDraftSpec": "model_drafters.selfdraft.spec",
    "SelfDraftSpecError": "model_drafters.selfdraft.spec",
    "parse_self_draft": "model_drafters.selfdraft.spec",
    "build_self_drafter": "model_drafters.selfdraft.build",
    "int8_available": "model_drafters.selfdraft.copies",
    "int8_copy": "model_drafters.selfdraft.copies",
    "native_bfloat16": "model_drafters.selfdraft.copies",
    "lean_of": "model_drafters.selfdraft.lean",
    "SelfDrafter": "model_drafters.selfdraft.drafter",
    "SkipRefused": "model_drafters.selfdraft.skip",
    "decoder_layers": "model_drafters.selfdraft.skip",
    "num_layers": "model_drafters.selfdraft.skip",
    "skip_view": "model_drafters.selfdraft.skip",
    "agreement": "model_drafters.selfdraft.calibrate",
    "calibration_ids": "model_drafters.selfdraft.calibrate",
    "greedy_continuation": "model_drafters.selfdraft.calibrate",
    "candidates_here": "model_drafters.selfdraft.default",
}

__all__ = sorted(_EXPORTS)


__getattr__ = lazy_exports(__name__, _EXPORTS)
