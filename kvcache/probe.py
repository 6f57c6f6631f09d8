"""Trust no cached forward until it is checked: measure, per model, which feeding path is exact.

Some transformers implementations compute a pass over a cache differently from the uncached
pass (the PyTorch paths of several recurrent models: a multi-token pass does not continue from
the cached state; a chunked scan leaves a wrong state after a prefill that is not a multiple of
its chunk; a model keeps its state outside the cache, where no rollback reaches it). The probe
replays, on a few tokens, what a speculative round does to a model through
:class:`kvcache.cache.CachedModel` -- a prefill of an uneven length, a single step, a multi-token
verify, a rollback of the kind the model uses (crop, or restore plus re-feed), another verify,
a full rejection and a single step -- and compares every logit it gets with one uncached forward
of the same ids, within a tolerance set by the dtype.

The first path that is exact, in this order, is the model's path:

- ``cached``: k tokens per forward over the cache (the fast path);
- ``stepwise``: the k tokens fed one per forward over the cache (exact where only
  multi-token cached passes are wrong; each forward is counted);
- ``uncached``: the whole sequence every step (exact by definition, slow): where even a
  single cached step or a rollback is wrong, or a rollback raises.

A model whose cache the engine refuses outright (``UnsupportedCacheError``, e.g. a cache class
of the model's own on transformers 4.57) gets ``refused``, with the refusal's one line; so does
a model whose uncached forward raises (transformers cannot run it at all: xLSTM's kernels copied
to bfloat16, say), with the exception's first line.

The probe also measures whether the model's forward is causal at all: its first positions fed
alone must score as they do inside the longer sequence. Where they do not (transformers 5.10's
Zamba2 and Nemotron-H on the PyTorch path), a verify pass scores a position differently from
the step that decodes it alone, so no drafting strategy can match the model's own decoding:
:func:`not_causal` says why, and the verify loop refuses such a target in one line.

The decision rests on what the probe measures, never on a model's name. :func:`probe_of`
remembers the result per model object, so a model is probed once; the loaders probe both
models at load and attach the result to the pair (:func:`probe_pair`).
"""

from __future__ import annotations

import time
import weakref
from dataclasses import asdict, dataclass

import torch
import transformers

from kvcache.cache import CachedModel, SessionModel, UnsupportedCacheError
from utils.hf_load import text_config

PREFIX = 6          # an uneven cached prefix: not a multiple of any chunk or window of 2, 4, 8...
DRAFTS = 4          # tokens a multi-token verify feeds at once
LENGTH = PREFIX + 4 + DRAFTS
# Largest allowed |cached - uncached| logit, as a fraction of the largest |logit| of the
# uncached forward. Cached and uncached kernels sum in different orders; bfloat16 keeps 8
# bits of mantissa (relative step 2^-8 = 0.0039), float16 11, float32 24. A wrong state
# moves logits by a large fraction of their range.
TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-6, torch.float16: 2e-2, torch.bfloat16: 5e-2}
DEFAULT_TOLERANCE = 5e-2


@dataclass(frozen=True)
class ProbeResult:
    """Which path one model takes, and why.

    ``path``: cached, stepwise, uncached or refused. ``reason``: the first check the
    faster path failed (empty for cached). ``error``: the largest logit difference
    measured on the chosen path; ``tolerance``: the bound it was held to.
    ``rollback``: the rollback kind the model used (crop or restore).
    """

    model: str
    dtype: str
    path: str
    reason: str = ""
    error: float = 0.0
    tolerance: float = 0.0
    rollback: str = ""
    seconds: float = 0.0
    causal: bool = True     # False: a position's uncached logits change with the tokens after it (``not_causal``)
    causal_error: float = 0.0   # by how much, as a fraction of the logit range

    def line(self) -> str:
        """One line: ``cached (restore, max error 3e-06 <= 0.029)`` or ``stepwise: <why>``."""
        if self.path in ("refused", "served"):
            return f"{self.path}: {self.reason}"
        measured = f"{self.rollback + ', ' if self.rollback else ''}max error {self.error:.2g} <= {self.tolerance:.2g}"
        if self.path == "cached":
            return f"cached ({self.reason or measured})"   # a reason: recorded, not measured (``remember``)
        return f"{self.path} ({measured}): {self.reason}"

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class PairProbe:
    """The probe of a target and a drafter, and the seconds both took.

    ``drafter_on_target_cache``: the drafter is made from the target and drafts on the target's
    cache where it can (``selfdraft.drafter.SelfDrafter``). Its own probe then describes only
    the fallback where it keeps a cache of its own: a dynamic int8 copy, say, probes
    ``uncached`` (each forward quantises its activations as one tensor) yet drafts exactly
    over the target's cache.
    """

    target: ProbeResult
    drafter: ProbeResult
    seconds: float
    drafter_on_target_cache: bool = False

    def summary(self) -> str:
        """One line for the banner, ``/config`` and the self-test's first line."""
        line = (f"cache probe ({self.seconds:.2f} s): target {self.target.line()}; "
                f"drafter {self.drafter.line()}")
        if self.drafter_on_target_cache:
            line += (" (the drafter drafts on the target's cache where it can; its own probe "
                     "applies only when it keeps a cache of its own)")
        return line

    def to_dict(self) -> dict:
        return {"target": self.target.to_dict(), "drafter": self.drafter.to_dict(), "seconds": self.seconds,
                "drafter_on_target_cache": self.drafter_on_target_cache}


class ProbeMismatch(AssertionError):
    """A cached forward gave other logits than the uncached one (the message says where)."""


# ----------------------------------------------------------------- the probe

def tolerance(model) -> float:
    """The relative bound for the model's compute dtype."""
    return TOLERANCE.get(getattr(model, "dtype", None), DEFAULT_TOLERANCE)


def _probe_ids(model) -> tuple[list[int], list[int], list[int]]:
    """(encoder prompt, the true sequence S, a sequence J that shares S's first PREFIX+3 ids)."""
    vocab = int(text_config(model.config).vocab_size)
    low = 3 if vocab > 16 else 0                                    # keep clear of the usual special ids
    span = min(vocab, 30000) - low

    def ids(seed: int, n: int) -> list[int]:
        return [low + (seed + 7919 * i * i + 104729 * i) % span for i in range(n)]

    seq = ids(11, LENGTH)
    junk = ids(53, LENGTH)
    return ids(97, PREFIX + 1), seq, seq[:PREFIX + 3] + junk[PREFIX + 3:]


def _uncached(model, prompt: list[int], seqs: list[list[int]], start: int | None) -> torch.Tensor:
    """Uncached logits of every position of each sequence, (len(seqs), L, V)."""
    device = CachedModel(model, use_cache=False).device
    if start is None:
        return model(input_ids=torch.tensor(seqs, device=device), use_cache=False).logits
    decoder = torch.tensor([[start, *s[1:]] for s in seqs], device=device)
    encoder = torch.tensor([prompt] * len(seqs), device=device)
    return model(input_ids=encoder, decoder_input_ids=decoder, use_cache=False).logits


def _causal_error(model, prompt: list[int], seq: list[int], start: int | None, reference: torch.Tensor) -> float:
    """How far the uncached logits of ``seq``'s first PREFIX + 1 positions, fed alone, are from the
    same positions inside the whole sequence's forward (``reference[0]``), as a fraction of the
    logit range: 0 for a causal model, whatever its kernels. transformers 5.10's Zamba2 without
    its mamba kernels is not causal (0.3 of its range): its scan pads to the sequence's length."""
    # Both of the reference's sequences start with these ids: a batch of the same size as the
    # reference's (transformers 4.57's RecurrentGemma keeps a batch-sized state in its modules).
    alone = _uncached(model, prompt, [seq[:PREFIX + 1]] * reference.shape[0], start).float()
    want = reference[:, :PREFIX + 1].float()
    scale = max(1.0, float(reference.float().abs().max()))
    return float((alone[..., :want.shape[-1]] - want).abs().max()) / scale


class _Checker:
    """Compares cached logits with the uncached ones and keeps the largest error."""

    def __init__(self, reference: torch.Tensor, bound: float):
        self.reference = reference.float()                          # (2, L, V)
        self.scale = max(1.0, float(self.reference.abs().max()))
        self.bound = bound
        self.error = 0.0

    def check(self, got: torch.Tensor, seq: int, rows: range, what: str) -> None:
        want = self.reference[seq, rows.start:rows.stop]            # (keep, V)
        error = float((got.float()[:, :want.shape[-1]] - want).abs().max()) / self.scale
        self.error = max(self.error, error)
        if not error <= self.bound:
            raise ProbeMismatch(f"{what} differs from the uncached forward by {error:.2g} of the "
                                f"logit range (tolerance {self.bound:.2g})")


def _replay(model, path: str, prompt: list[int], seqs: list[list[int]], checker: _Checker,
            encoder_decoder: bool) -> str:
    """One speculative-shaped episode on ``path``; raises ProbeMismatch at the first wrong logit.

    Returns the rollback kind the cache used ("crop" or "restore").
    """
    return _replay_on(CachedModel(model, path=path), seqs, checker, prompt if encoder_decoder else None)


def _replay_on(cached: CachedModel, seqs: list[list[int]], checker: _Checker, prompt: list[int] | None = None) -> str:
    """The episode of :func:`_replay` on a model already built (``prompt``: an encoder-decoder's)."""
    s, j = seqs
    start = cached.begin(prompt if prompt is not None else s[:PREFIX])
    if prompt is not None:
        s, j = [start[0], *s[1:]], [start[0], *j[1:]]
    device = cached.device

    def feed(ids: list[int], keep: int) -> torch.Tensor:
        return cached.forward(torch.tensor([ids], device=device), keep=keep)

    p, k = PREFIX, DRAFTS
    checker.check(feed(s[:p], 1), 0, range(p - 1, p), f"the prompt's prefill ({p} tokens)")
    checker.check(feed(s[:p + 1], 1), 0, range(p, p + 1), f"a single step after a cached prefix of {p}")
    cached.checkpoint()                                 # a verify: S[p+1] and k drafts over p+1 cached
    checker.check(feed(j[:p + 2 + k], k + 1), 1, range(p + 1, p + 2 + k),
                  f"a {k + 1}-token pass over a cached prefix of {p + 1}")
    cached.rollback(p + 3)                              # kept: one draft and the target's token
    kind = cached.stats.method
    cached.checkpoint()
    checker.check(feed(s[:p + 4 + k], k + 1), 0, range(p + 3, p + 4 + k),
                  f"a {k + 1}-token pass after a {kind}")
    cached.rollback(p + 4)                              # every draft rejected
    checker.check(feed(s[:p + 5], 1), 0, range(p + 4, p + 5), f"a single step after a {kind}")
    return kind


@torch.inference_mode()
def check_episode(model, cached: CachedModel) -> str | None:
    """The probe's episode on ``cached`` (a decoder-only ``model`` built on another cache, e.g.
    ``kvcache.static``'s), held to the uncached logits: None when every logit matches, else what
    differed or what raised (one line)."""
    _, seq, junk = _probe_ids(model)
    try:
        reference = _uncached(model, [], [seq, junk], None)
        _replay_on(cached, [seq, junk], _Checker(reference, tolerance(model)))
    except ProbeMismatch as e:
        return f"not exact: {e}"
    except Exception as e:  # noqa: BLE001  (a transformers error inside a forward or a rollback)
        return f"fails: {_first_line(e)}"
    return None


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"


@torch.inference_mode()
def probe_model(model) -> ProbeResult:
    """Measure which path is exact for ``model`` (a few forwards over 14 tokens); a served
    target's cache is the engine's, so it is not probed (path "served")."""
    begun = time.perf_counter()
    if isinstance(model, SessionModel):
        return ProbeResult(type(model).__name__, "", "served", "its cache is the server's")
    encoder_decoder = bool(getattr(model.config, "is_encoder_decoder", False))
    prompt, seq, junk = _probe_ids(model)
    bound = tolerance(model)
    name, dtype = type(model).__name__, str(getattr(model, "dtype", "")).removeprefix("torch.")
    start = None
    if encoder_decoder:
        start = CachedModel(model, use_cache=False).decoder_start_token()
    try:
        reference = _uncached(model, prompt, [seq, junk], start)
    except Exception as e:  # noqa: BLE001  (transformers cannot run the model at all: no path can)
        return ProbeResult(name, dtype, "refused", f"{name} does not run in {dtype} here ({_first_line(e)})",
                           seconds=time.perf_counter() - begun)
    try:
        causal_error = _causal_error(model, prompt, seq, start, reference)
    except Exception:  # noqa: BLE001  (not measured: the replays below meet whatever broke)
        causal_error = 0.0
    causal = causal_error <= bound
    reasons: list[str] = []
    for path in ("cached", "stepwise"):
        checker = _Checker(reference, bound)
        try:
            kind = _replay(model, path, prompt, [seq, junk], checker, encoder_decoder)
        except UnsupportedCacheError as e:
            return ProbeResult(name, dtype, "refused", str(e), tolerance=bound, seconds=time.perf_counter() - begun,
                               causal=causal, causal_error=causal_error)
        except ProbeMismatch as e:
            reasons.append(f"{path}: {e}")
            continue
        except Exception as e:  # noqa: BLE001  (a transformers error inside a cached pass or a rollback)
            reasons.append(f"{path}: {_first_line(e)}")
            continue
        return ProbeResult(name, dtype, path, "; ".join(reasons), checker.error, bound, kind,
                           time.perf_counter() - begun, causal, causal_error)
    return ProbeResult(name, dtype, "uncached", "; ".join(reasons), 0.0, bound, "", time.perf_counter() - begun,
                       causal, causal_error)


_RESULTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_RECORDED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # by ``remember``: nothing to measure


def probe_of(model) -> ProbeResult:
    """The probe of ``model``, run on first use and remembered for the model object."""
    found = _RESULTS.get(model) or _RECORDED.get(model)
    if found is None:
        found = _RESULTS[model] = probe_model(model)
    return found


def cached_model(model, *, use_cache: bool = True) -> CachedModel:
    """``model`` as a :class:`CachedModel` fed on the path its probe measured (probed on first use);
    a served target's own session (its cache is the engine's: never probed, always on)."""
    if isinstance(model, SessionModel):
        return model.session()
    if not use_cache:
        return CachedModel(model, use_cache=False)
    found = probe_of(model)
    return CachedModel(model, path=found.path, reason=found.reason)


def not_causal(model) -> str | None:
    """Why drafting cannot be lossless with ``model`` as the target, or None: its forward is not
    causal (a position's logits change with the tokens after it, as the probe measured), so a
    verify pass scores a position differently from the step that decodes it alone. Target AR
    still runs (each step is the model's own definition); a drafter need not be causal."""
    if isinstance(model, SessionModel) or not runs_alone(model):
        return None
    found = probe_of(model)
    if found.causal:
        return None
    return (f"{found.model}'s forward is not causal in transformers {transformers.__version__}: a position's "
            f"logits change with the tokens after it (by {found.causal_error:.2g} of the logit range, tolerance "
            f"{found.tolerance:.2g}), so no drafting strategy can match its own decoding (target AR runs); "
            "another transformers release may run it")


def remember(model, result: ProbeResult) -> None:
    """Record ``result`` as ``model``'s probe without running it (a model that cannot run alone,
    such as a target's MTP layers, an EAGLE-3 head or a Gemma 4 assistant, whose drafter keeps and
    rolls back their cache itself). :func:`forget` leaves it: there is nothing to measure again."""
    _RECORDED[model] = result


def runs_alone(model) -> bool:
    """False for a model whose probe was recorded with :func:`remember`: it drafts from its target's
    state (MTP layers, an EAGLE-3 head, a Gemma 4 assistant), so it is never probed, nor prefilled
    on its own."""
    return model not in _RECORDED


def forget(model) -> None:
    """Drop the remembered probe of ``model`` (after its weights changed)."""
    _RESULTS.pop(model, None)


def probe_pair(pair) -> PairProbe:
    """Probe a pair's target and drafter (once each; a self-draft's one model once).

    The function the loaders (``utils.models.load_pair``, ``model_drafters.selfdraft.load``) and the self-test
    call: ``probe_pair(pair).summary()`` is its one-line result. A pair whose
    ``drafts_on_target_cache`` is set (a self-drafter) says so beside the drafter's result.
    """
    begun = time.perf_counter()
    target = probe_of(pair.target)
    drafter = probe_of(pair.drafter)
    return PairProbe(target, drafter, time.perf_counter() - begun,
                     drafter_on_target_cache=pair.drafts_on_target_cache)
