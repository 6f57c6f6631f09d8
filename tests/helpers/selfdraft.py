"""The slow obvious reference the self-drafter tests compare skipped layers with."""

from __future__ import annotations


def identity_hooks(target, skipped, last_only: bool):
    """Forward hooks that make the ``skipped`` decoder layers pass their input through
    (at every position, or only at the last one): the slow obvious reference."""
    from model_drafters.selfdraft.skip import decoder_layers

    _, layers = decoder_layers(target)

    def hook(module, args, kwargs, output):
        hidden = args[0] if args else kwargs["hidden_states"]
        out = output[0] if isinstance(output, tuple) else output
        new = out.clone()
        if last_only:
            new[:, -1:] = hidden[:, -1:]
        else:
            new = hidden.clone()
        return (new, *output[1:]) if isinstance(output, tuple) else new

    return [layers[i].register_forward_hook(hook, with_kwargs=True) for i in skipped]
