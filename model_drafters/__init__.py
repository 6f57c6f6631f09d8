"""The model drafters: each kind of drafter model in a package of its own.

``selfdraft`` (drafters made from the target), ``cross_tokenizer`` (a drafter with another
tokenizer), ``mtp`` (the target's MTP layers), ``eagle3`` (an EAGLE-3 head) and
``gemma4_assistant`` (a Gemma 4 assistant). Each exports one :class:`model_drafters.kind.DrafterKind`
(``KIND``) saying what the engine needs of it; ``engine.kinds`` lists them.
"""
