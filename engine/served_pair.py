"""A pair whose target is behind a serving engine: the drafter and the tokenizer load here.

``load_served_pair`` connects, loads the drafter and its tokenizer, and checks that the server's
model reads the same vocabulary (length, and ids of a probe text on both sides). A drafter kind that
cannot draft beside a served target says why (``DrafterKind.served``). Every failure is one line.
"""

from __future__ import annotations

from engine.kinds import kind_of_spec
from remote.connect import connect
from remote.dialect import ServedModelInfo, ServerClient
from remote.transport import Backoff, ServerError
from remote.rules import DEFAULT_PROBS, rules_text
from remote.target import ServedTarget
from utils.devices import model_device
from utils.models import LoadOptions, ModelLoadError, ModelPair, describe, load_model
from utils.vocab import end_token_ids, logits_width

# Spaces, digits, punctuation, an accent and a newline: where tokenizers tend to differ.
PROBE_TEXT = "Hello, world! 12,345 cafés\n  indented\tand <b>tagged</b>."


def load_served_pair(url: str, kind: str | None = None, drafter: str | None = None, *,
                     n_probs: int = DEFAULT_PROBS, backoff: Backoff = Backoff(), options: LoadOptions | None = None,
                     **keywords) -> ModelPair:
    """The pair (served target, local drafter); ``drafter=None`` drafts with the offline default. How the
    drafter loads is ``options``, or ``utils.models.LoadOptions``' fields as keywords (``device``,
    ``dtype``, ``drafter_quantize``, ``progress``, ``cache_dir``)."""
    options = LoadOptions.of(options, **keywords)
    say = options.say
    drafter_kind = kind_of_spec(drafter)
    if drafter_kind is not None and drafter_kind.served is not None:
        raise ModelLoadError(f"--drafter {drafter} {drafter_kind.served}")
    if isinstance(n_probs, bool) or not isinstance(n_probs, int) or n_probs < 1:
        raise ModelLoadError(f"--server-probs must be an integer >= 1, got {n_probs!r}")
    try:
        say(f"Connecting to {url}")
        client = connect(url, kind, backoff)
        info = client.info()
    except ServerError as e:
        raise ModelLoadError(str(e)) from None
    model, tokenizer = load_model(drafter, device=options.device, dtype=options.dtype,
                                  quantize=options.drafter_quantize, progress=say, cache_dir=options.cache_dir)
    name = describe(drafter, model, options.drafter_quantize)
    check_same_vocabulary(client, info.vocab_size, tokenizer, model, name, named=drafter is not None)
    return served_pair_of(client, info, model, tokenizer, drafter_name=name, n_probs=n_probs)


def served_pair_of(client: ServerClient, info: ServedModelInfo, drafter, tokenizer, *, drafter_name: str = "",
                   n_probs: int = DEFAULT_PROBS) -> ModelPair:
    """A ``ModelPair`` of the model behind ``client`` and the local ``drafter`` (its vocabulary checked
    by the caller); the banner's notes state what is lossless against this server."""
    vocab = min(info.vocab_size, len(tokenizer), logits_width(drafter))
    n = min(n_probs, info.vocab_size)
    target = ServedTarget(client, info, n_probs=n, device=model_device(drafter))
    label = f"{info.name} on {client.transport.url} ({client.kind}{', ' + info.detail if info.detail else ''})"
    return ModelPair(
        target=target, drafter=drafter, tokenizer=tokenizer, target_name=label,
        drafter_name=drafter_name or type(drafter).__name__, end_tokens=end_token_ids(tokenizer, drafter),
        device=model_device(drafter), vocab_size=vocab, context_length=info.context_length,
        self_draft_demo=False, notes=(rules_text(n, info.vocab_size),),
    )


def check_same_vocabulary(client, server_vocab: int, tokenizer, model, name: str, *, named: bool) -> None:
    """Refuse (one line) a server whose model reads another vocabulary than ``tokenizer``."""
    advice = ("pass a --drafter that shares the server model's tokenizer" if named else
              "the offline default does not share the server model's tokenizer: name a --drafter that does")
    here = len(tokenizer)
    if server_vocab != here and server_vocab != logits_width(model):
        raise ModelLoadError(f"the server's model has {server_vocab} tokens, {name} {here}: {advice}")
    try:
        there_ids = client.tokenize(PROBE_TEXT)
    except ServerError as e:
        raise ModelLoadError(str(e)) from None
    here_ids = tokenizer(PROBE_TEXT, add_special_tokens=False).input_ids
    if there_ids != here_ids:
        first = next((i for i, (a, b) in enumerate(zip(there_ids, here_ids)) if a != b),
                     min(len(there_ids), len(here_ids)))
        raise ModelLoadError(f"the server tokenizes {PROBE_TEXT[:20]!r}... differently from {name} "
                             f"(first at token {first}): {advice}")
