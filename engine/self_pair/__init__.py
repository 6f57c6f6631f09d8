"""Loading a pair whose drafter is made from its target (``self:...`` and the offline default),
and measuring, on this machine, which self-drafter pays: the measuring decodes through
``engine.run_strategy`` like every front end, so it sits in the engine's layer, above ``selfdraft``
(which builds the drafters)."""
