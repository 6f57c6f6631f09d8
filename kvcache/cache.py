"""KV-cache helpers shared by every decoding loop: one model's cache, fed and rolled back.

The rule the loops follow: a forward pass feeds only the tokens the cache has
not seen, and after a verify round the cache is rolled back to what was kept.
How a rollback is done is decided per cache layer, from what the layer says
about itself (its class, ``is_sliding``, ``is_croppable``, ``record_past``),
never from a model's name:

- full attention (``DynamicLayer``): cropped;
- sliding-window attention: past recording is turned on before the prefill, so
  a crop past the window is exact; the layer is trimmed back to its window
  after every round, so memory stays bounded. Where the installed
  transformers cannot record the past, the layer is snapshotted instead;
- conv / linear-attention states (LFM2): cropped while recording the past;
- recurrent states (Mamba, Mamba2, Jamba, Falcon-H1, Qwen3-Next, Qwen3.5),
  whose ``is_croppable`` is False: the layer is snapshotted before a forward
  whose tail may be rejected; a rollback restores the snapshot and crops every
  other layer back to the same length, so the cache holds a shorter prefix of
  the kept sequence and the next forward re-feeds the missing tokens along with
  its own (no extra forward pass; :class:`RollbackStats` counts them);
- a cache class of the model's own (xLSTM's ``xLSTMCache``, MiniMax's
  ``MiniMaxCache``, which keeps its linear-attention state beside its layers
  and cannot be cropped): the model makes it on its first forward, and a
  checkpoint snapshots the whole of it, restored as above. On 4.57, where
  most recurrent models carry such a class, it is refused (docs/versions.md);
- static caches: refused with :class:`UnsupportedCacheError`.

How a model is fed is its *path*, decided by :mod:`kvcache.probe` from what the
model computes, never from its name: ``cached`` (a k-token forward over the
cache), ``stepwise`` (the same k tokens fed one at a time over the cache, where
transformers computes a multi-token cached pass wrongly; every single-token
forward is counted) or ``uncached`` (the whole sequence every step, where even
a single cached step or a rollback is wrong).

``Cache.crop`` changed meaning three times within transformers 5.x
(``crop(max_length)`` up to 5.13; ``crop(0)`` empties a cache before 5.14;
only ``crop(-n)`` from 5.20). :func:`drop_last` is the one place that knows.

Encoder-decoder models (T5, BART) run their encoder once per prompt; the
decoder's self-attention cache is the one rolled back (cross-attention never
changes). :meth:`CachedModel.begin` returns the sequence the loops extend: the
prompt for a decoder-only model, the decoder start token for an
encoder-decoder one.
"""

from __future__ import annotations

import copy
import inspect
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields

import torch
import transformers
from packaging.version import Version
from transformers import Cache, DynamicCache, EncoderDecoderCache

from utils.devices import model_device
from utils.hf_load import text_config

# (major, minor, micro) of the installed transformers, e.g. (5, 23, 0)
TRANSFORMERS_RELEASE = Version(transformers.__version__).release
# Before 5.14 ``crop(0)`` means "keep 0 tokens"; from 5.14 it removes nothing
# (and, from 5.19, trims sliding-window and conv buffers back to their size).
CROP_ZERO_KEEPS = TRANSFORMERS_RELEASE >= (5, 14)


class UnsupportedCacheError(ValueError):
    """The model's cache cannot be rolled back exactly; the message says why (one line)."""


class SessionModel:
    """A model whose cache lives outside this process (a target behind a server:
    ``generation.served.ServedModel``): nothing here can probe, feed or roll it back.

    It makes its own session for each generation (:meth:`session`, shaped like
    :class:`CachedModel`: ``begin``, ``forward``, ``checkpoint``, ``rollback``, ``length``,
    ``forwards``, ``stats``, ``network_stats``, and ``tree_reason``: why it verifies no token
    tree). ``kvcache.probe.cached_model`` hands out that session; nothing is probed.
    """

    def session(self):
        raise NotImplementedError


@dataclass
class RollbackStats:
    """How one model's cache was rolled back during a generation, and what it cost.

    ``method``: "crop" (every layer cropped in place), "restore" (some layers
    are snapshotted before each forward and restored on rejection; the tokens
    the restore dropped are re-fed with the next forward) or "none" (no cache).
    ``snapshots`` / ``restores``: how often layers were copied / put back.
    ``refed_tokens``: tokens fed a second time because a restore went back
    further than the kept sequence. ``seconds``: time spent copying and
    restoring, on the device's own clock (CUDA events on a GPU, read when
    :meth:`to_dict` is called; the re-fed tokens' compute is inside the forward passes).
    ``path`` / ``reason``: how the model was fed and, unless "cached", why.
    ``step``: "lean" where a self-drafter drafted through its lean one-token step
    (``selfdraft.lean``), else "".
    """

    method: str = "crop"
    snapshots: int = 0
    restores: int = 0
    refed_tokens: int = 0
    seconds: float = 0.0
    path: str = "cached"    # how the model was fed: cached, stepwise or uncached (see kvcache.probe)
    reason: str = ""        # why, when the path is not "cached"
    step: str = ""          # "lean": a self-drafter's lean one-token step drafted
    # CUDA event pairs of spans not yet added to ``seconds`` (a GPU's copies run after the host
    # has moved on: reading them at once would stop the clock before the kernels do).
    pending: list = field(default_factory=list, repr=False, compare=False)

    @contextmanager
    def timing(self, device: torch.device) -> Iterator[None]:
        """Add the body's time to ``seconds``: perf_counter on a CPU, events on a GPU (no sync here)."""
        if device.type != "cuda":
            start = time.perf_counter()
            yield
            self.seconds += time.perf_counter() - start
            return
        start_event = torch.cuda.Event(enable_timing=True)
        start_event.record()
        yield
        end_event = torch.cuda.Event(enable_timing=True)
        end_event.record()
        self.pending.append((start_event, end_event))

    def settle(self) -> None:
        """Add the pending spans to ``seconds``, waiting for each to finish."""
        for start, end in self.pending:
            end.synchronize()
            self.seconds += start.elapsed_time(end) / 1000.0
        self.pending.clear()

    def to_dict(self) -> dict:
        self.settle()
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "pending"}


# ------------------------------------------------------------ crop semantics

def drop_last(cache, n: int) -> None:
    """Remove the last ``n`` positions of ``cache`` (``n`` >= 0), on any supported transformers.

    ``crop(-n)`` means "remove n" on every release from 4.57 to 5.23; a
    positive argument means "keep that many" before 5.20 and raises after.
    With ``n == 0`` nothing is removed, but from 5.14 on ``crop(0)`` trims
    sliding-window and conv buffers recorded for a rollback back to their
    working size; before 5.14 it would empty the cache, so it is skipped.
    """
    if n < 0:
        raise ValueError(f"cannot remove a negative number of positions ({n})")
    layers = getattr(cache, "layers", None)
    if layers is not None and any(map(never_filled, layers)):
        for layer in layers:                # the cache's own crop would crop these too, and fail
            if not never_filled(layer):
                drop_last(layer, n)
        return
    if n > 0:
        cache.crop(-n)
    elif CROP_ZERO_KEEPS:
        cache.crop(0)


def never_filled(layer) -> bool:
    """A cache layer no forward has written: it holds nothing, so there is nothing to crop.

    transformers 5.x before 5.24 gives every block of a hybrid model a layer: an MLP block
    (Nemotron-H) a linear-attention layer whose conv kernel size stays unknown, a recurrent block
    (RecurrentGemma, 5.17) an attention layer whose keys stay None, where 5.24 gives such blocks
    a ``DummyLayer``. Their own ``crop`` raises (``bad operand type for unary -: 'NoneType'``,
    ``'NoneType' object is not subscriptable``).
    """
    if getattr(layer, "is_initialized", None) is False:
        return True
    conv, recurrent = getattr(layer, "conv_states", None), getattr(layer, "recurrent_states", None)
    if not isinstance(conv, dict) or not isinstance(recurrent, dict):
        return False
    return (all(state is None for state in conv.values()) and all(state is None for state in recurrent.values())
            and getattr(layer, "keys", None) is None)


# From 5.15 (when sliding-window layers learnt to record their past; 5.14's keep only their window
# and are snapshotted) to 5.17 a sliding-window layer that records its past hands attention every key it
# holds, while the mask covers only the window: a second forward before a crop fails ("The size
# of tensor a (21) must match the size of tensor b (8)"). 5.18 returns the visible keys only.
SLIDING_UPDATE_RETURNS_ALL = (5, 15) <= TRANSFORMERS_RELEASE < (5, 18)
_VISIBLE_CLASSES: dict[type, type] = {}


def _visible_class(cls: type) -> type:
    """``cls`` with 5.18's ``update``: the keys and values the mask covers, not all it records.
    It keeps its base class's name (the cache policy reads layers by class name)."""
    if cls not in _VISIBLE_CLASSES:
        def update(self, key_states, value_states, *args, **kwargs):
            keys, values = cls.update(self, key_states, value_states, *args, **kwargs)
            if not self.record_past:
                return keys, values
            visible = self.sliding_window - 1 + key_states.shape[-2]
            return keys[:, :, -visible:, :], values[:, :, -visible:, :]

        _VISIBLE_CLASSES[cls] = type(cls.__name__, (cls,), {"update": update, "__doc__": cls.__doc__})
    return _VISIBLE_CLASSES[cls]


def record_past(cache) -> None:
    """Make ``cache``'s sliding-window layers record the positions a rollback needs (a later crop
    trims them back to the window), on every transformers that can."""
    if not hasattr(cache, "activate_past_recording"):
        return
    cache.activate_past_recording()
    if not SLIDING_UPDATE_RETURNS_ALL:
        return
    for layer in _layers(cache):
        if getattr(layer, "is_sliding", False) and getattr(layer, "record_past", False) \
                and type(layer) not in _VISIBLE_CLASSES.values():
            layer.__class__ = _visible_class(type(layer))


def _self_attention(cache):
    """The cache whose layers hold the generated sequence (the decoder's self-attention)."""
    if isinstance(cache, EncoderDecoderCache):
        return cache.self_attention_cache
    return cache


def cache_length(cache) -> int:
    """Number of positions an attention cache holds (0 for no cache)."""
    return int(cache.get_seq_length()) if cache is not None else 0


# --------------------------------------------------------- per-layer policy

def _layers(cache) -> list:
    layers = getattr(_self_attention(cache), "layers", None)
    return list(layers) if layers is not None else []


def _is_static(layer) -> bool:
    """A fixed-size layer (``StaticLayer``, ``StaticSlidingWindowLayer``, ...)."""
    return type(layer).__name__.startswith("Static")


def _croppable(layer) -> bool:
    """Whether cropping this layer puts it back exactly as it was (else it is snapshotted)."""
    if getattr(layer, "is_sliding", False) and not getattr(layer, "record_past", False):
        return False  # past the window the dropped positions are gone
    if type(layer).__name__ == "StaticLayer":
        return True   # rolled back by its length on every release (kvcache.static), whatever its flag (5.17: False)
    flag = getattr(layer, "is_croppable", None)
    if flag is not None:
        # Linear-attention layers report False until their first forward; a
        # conv-only layer (no recurrent state) becomes croppable once seen.
        return bool(flag)
    # Before 5.17 no layer says whether it is croppable; these crop exactly (an indexed
    # layer, DeepSeek-V3.2's from 5.14, crops its indexer keys with its keys and values).
    return type(layer).__name__ in ("DynamicLayer", "DynamicSlidingWindowLayer", "DynamicIndexedLayer",
                                    "QuantoQuantizedLayer", "HQQQuantizedLayer", "QuantizedLayer")


def view_of(cache, layer_numbers: list[int] | None = None):
    """A cache made of ``cache``'s layers at ``layer_numbers`` (all: None): the same objects, not copies."""
    layers = _layers(cache)
    return Cache(layers=layers if layer_numbers is None else [layers[i] for i in layer_numbers])


def snapshot(layer):
    """A copy of a layer that a crop cannot put back, taken before a forward that may be rejected."""
    return copy.deepcopy(layer)


def new_cache(model):
    """An empty dynamic cache for ``model`` (an encoder-decoder cache for seq2seq models)."""
    config = model.config
    if getattr(config, "is_encoder_decoder", False):
        decoder = text_config(config, decoder=True)
        return EncoderDecoderCache(DynamicCache(config=decoder), DynamicCache(config=decoder))
    return DynamicCache(config=config)


def _own_cache_class(model) -> str | None:
    """The name of a cache class the model's own module defines, if any.

    Before transformers kept recurrent and conv states in layers of the shared
    ``Cache`` (5.x), such models carried a cache class of their own (4.57's
    ``MambaCache``, ``HybridMambaAttentionDynamicCache``, ...) that a
    ``DynamicCache`` cannot stand in for. A few models still do on 5.x: xLSTM
    (``xLSTMCache``) and MiniMax (``MiniMaxCache``, a ``DynamicCache`` that
    keeps its linear-attention state beside its layers and cannot be cropped).
    """
    module = sys.modules.get(type(model).__module__)
    for name, value in vars(module or object).items():
        if isinstance(value, type) and name.endswith("Cache") and value.__module__ == module.__name__:
            return name
    return None


def _refuse_own_cache(model, own: str) -> None:
    """On 4.57 a cache class of the model's own is refused (docs/versions.md); from 5 on it is
    snapshotted whole (:meth:`CachedModel.checkpoint`)."""
    if TRANSFORMERS_RELEASE < (5,):
        raise UnsupportedCacheError(
            f"{type(model).__name__} keeps its state in its own {own}, which transformers "
            f"{transformers.__version__} cannot roll back here; with transformers 5.x it can be "
            "(or turn /cache off)")


def _check_rollback_support(model, cache) -> None:
    for layer in _layers(cache):
        if _is_static(layer):
            raise UnsupportedCacheError(
                f"{type(layer).__name__}: a static cache has a fixed size and cannot be rolled back here; "
                "use the model's default dynamic cache")


# ------------------------------------------------------------ model + cache

_FORWARD_KWARGS: dict[type, tuple[str, str | None]] = {}


def cache_keyword(model) -> str:
    """The keyword ``model.forward`` takes its cache by (``past_key_values``, ``cache_params`` or ``cache``)."""
    return _forward_kwargs(model)[0]


def _forward_kwargs(model) -> tuple[str, str | None]:
    """(the cache keyword of ``model.forward``, the keyword limiting which positions get logits)."""
    cls = type(model)
    if cls not in _FORWARD_KWARGS:
        params = inspect.signature(model.forward).parameters
        # ``past_key_values`` (``cache_params`` for Mamba-like models) up to transformers 5.23;
        # ``cache`` from 5.24 on, where the old names survive as deprecated aliases on some models only.
        cache_kw = next((name for name in ("past_key_values", "cache_params", "cache") if name in params),
                        "past_key_values")
        logits_kw = next((n for n in ("logits_to_keep", "num_logits_to_keep") if n in params), None)
        _FORWARD_KWARGS[cls] = (cache_kw, logits_kw)
    return _FORWARD_KWARGS[cls]


PATHS = ("cached", "stepwise", "uncached", "refused")


def off_path(reason: str = "") -> dict:
    """One model's fields of a result's ``compile`` on the dynamic path: ``off``, nothing captured;
    ``reason``: why, where a static path was asked (``kvcache.static``)."""
    return {"path": "off", "reason": reason, "widths": [], "buckets": [], "captures": 0, "capture_s": 0.0,
            "recompiles": 0, "eager": 0}
# Which of a forward's ``hidden_states`` a model that keeps them (``CachedModel.keep_hidden``
# True) keeps: the last, the final-normed state transformers' own MTP drafting reads
# (``MTPCandidateGenerator``: ``output_hidden_states=-1``, ``hidden_states[-1]``).
HIDDEN_STATE = -1


def kept_layers(keep_hidden) -> tuple[int, ...]:
    """The ``hidden_states`` indices ``keep_hidden`` asks for: () for False, the last for True,
    else the given indices (an EAGLE-3 head's low, mid and high layers)."""
    if keep_hidden is True:
        return (HIDDEN_STATE,)
    return tuple(int(i) for i in keep_hidden) if keep_hidden else ()


# From 5.23 an index or a list as ``output_hidden_states`` keeps only those states, each at its own
# index; before, a list kept states at the wrong indices (5.17: ``hidden_states[2]`` was not the
# full run's ``hidden_states[2]``), so every state is asked for there.
SELECTS_HIDDEN_STATES = TRANSFORMERS_RELEASE >= (5, 23)


def hidden_states_request(layers: tuple[int, ...]):
    """The ``output_hidden_states`` argument that returns ``hidden_states[i]`` for each of ``layers``."""
    if not SELECTS_HIDDEN_STATES:
        return True
    return layers[0] if len(layers) == 1 else list(layers)


@dataclass(frozen=True)
class Prefill:
    """One model's cache after a prompt minus its last token (``kvcache.prefill.prefill``);
    never fed again: a generation that begins from it copies it.

    With ``replay_first``, the first forward of a generation begun from it is answered from
    memory when an earlier generation's first forward fed the same tokens on the same cache
    (the logits and a copy of the cache after it, kept in ``first_forwards``): a model's
    forward is a function of what it is fed, so many draws that begin alike pay it once.
    """

    model: object
    prompt: tuple[int, ...]
    cache: object
    length: int                 # positions of the (decoder) sequence the cache holds
    encoder_outputs: object     # an encoder-decoder model's encoder outputs, else None
    replay_first: bool = False
    # (tokens fed, rows kept) -> (logits, the cache after that forward, its length)
    first_forwards: dict = field(default_factory=dict, compare=False, repr=False)


def matching_prefill(prefills, model, prompt) -> Prefill | None:
    """The prefill among ``prefills`` of ``model`` on ``prompt`` (the latest given), or None."""
    prompt = tuple(prompt)
    return next((p for p in reversed(tuple(prefills)) if p.model is model and p.prompt == prompt), None)


class CachedModel:
    """One model and its cache during one generation.

    ``begin(prompt)`` starts a generation and returns the sequence to extend;
    ``forward(ids, keep)`` feeds the tokens of ``ids`` the cache has not seen and
    returns the logits of the last ``keep`` positions; ``checkpoint()`` before a
    forward whose tail may be rejected, then ``rollback(length)`` to keep only
    a prefix of at most ``length`` positions.

    ``path``: ``cached``, ``stepwise`` (multi-token forwards over a non-empty
    cache become single-token ones), ``uncached`` (no cache: every forward
    recomputes the whole sequence) or ``refused`` (the cache is refused with
    ``reason``, one line). With the cache on, the caller says which:
    ``kvcache.probe.cached_model`` builds one on the path the probe measured
    for the model (the decoding loops' way), and a test or a timing that knows
    its model may name one. Building one runs nothing.

    ``capture_s``: seconds this generation spent capturing forwards, left out of the run's
    time (none here: the static path's ``kvcache.static.StaticCachedModel`` captures);
    ``compile_reason``: why it runs this dynamic path where a static one was asked
    (``kvcache.static.loop_model`` says), read by :meth:`compile_stats`.
    """

    capture_s = 0.0
    compile_reason = ""

    def __init__(self, model, *, use_cache: bool = True, path: str | None = None, reason: str = ""):
        self.model = model
        self.encoder_decoder = bool(getattr(model.config, "is_encoder_decoder", False))
        self.cache_kw, self.logits_kw = _forward_kwargs(model)
        if use_cache and path is None:
            raise ValueError("a cached model needs its path: build it with kvcache.probe.cached_model")
        if path is not None and path not in PATHS:
            raise ValueError(f"path must be one of {', '.join(PATHS)}, got {path!r}")
        self.cache_off = not use_cache     # turned off by the caller (not by the probe)
        self.path = (path or "cached") if use_cache else "uncached"
        self.reason = reason if use_cache else "cache off"
        self.use_cache = use_cache and self.path != "uncached"
        self.cache = None
        # A cache class of the model's own: the model makes it on its first forward, and
        # a checkpoint snapshots all of it (no layer of it is cropped).
        self.own_cache = _own_cache_class(model)
        self.encoder_outputs = None
        self.stats = self._fresh_stats()
        self._snapshots: dict[int, object] = {}
        self._whole = None          # the own cache as it was at the last checkpoint
        self._checkpoint_length = 0
        self._length = 0  # positions fed and kept (pure-recurrent caches cannot report it)
        self.forwards = 0  # forward passes since begin()
        # A drafter that drafts from the target's hidden states sets ``keep_hidden`` before
        # ``begin``: True for the final ones (``mtp``), or a tuple of ``hidden_states`` indices
        # (``eagle3``: three layers). Every forward then keeps them in ``hidden``: (the sequence
        # position of its first row, rows (m, H) or, for several layers, (m, layers * H), the
        # layers side by side in the order given), the last ``forward``'s.
        self.keep_hidden: bool | tuple[int, ...] = False
        self.hidden: tuple[int, torch.Tensor] | None = None
        self._hidden_rows: list[tuple[int, torch.Tensor]] = []
        # A drafter that reads the target's shared keys and values (a Gemma 4 assistant) and has no
        # cache to read them from (cache off) sets ``keep_kv_states``: each forward then keeps the
        # ``shared_kv_states`` it returns (layer type -> (keys, values) from position 0, uncached).
        self.keep_kv_states = False
        self.kv_states: dict | None = None
        self._prefill: Prefill | None = None    # the prefill this generation began from

    @classmethod
    def over(cls, model, cache, length: int) -> CachedModel:
        """``model`` on an existing ``cache`` that holds ``length`` positions of its sequence.

        Fed on the ``cached`` path, without a probe: for a drafter that drafts on a cache it
        shares (:meth:`beside`) or keeps (``selfdraft.drafter``), dropping what it fed
        (``rollback(length)``)."""
        cached = cls(model, path="cached")
        cached.cache = cache
        cached._length = length
        return cached

    def beside(self, model, layers: list[int] | None = None) -> CachedModel:
        """``model`` (a self-drafter: this model's architecture, or its ``layers`` only) drafting on
        this cache: fed over this cache's layers at ``layers`` (all: None, the same layer objects) and
        holding this model's positions, as this model is fed. What it feeds is written into those
        layers; ``rollback(self.length)`` drops it again, leaving this cache as it was. It runs this
        model's path, for this model's ``compile_reason``."""
        cached = CachedModel.over(model, view_of(self.cache, layers), self._length)
        cached.compile_reason = self.compile_reason
        return cached

    def _fresh_stats(self) -> RollbackStats:
        return RollbackStats(method="crop" if self.use_cache else "none", path=self.path,
                             reason=self.reason if self.path != "cached" else "")

    # ------------------------------------------------------------- lifecycle

    def begin(self, prompt: list[int], prefills: tuple[Prefill, ...] = ()) -> list[int]:
        """Start a generation from ``prompt``; returns the (decoder) sequence the loop extends.

        With a :class:`Prefill` of this model on this prompt among ``prefills``
        (``kvcache.prefill.prefill``), the model begins from a copy of its cache
        (the prompt but its last token, fed once).
        """
        device = self.device
        if self.path == "refused":
            raise UnsupportedCacheError(self.reason)
        self.stats = self._fresh_stats()
        self._snapshots = {}
        self._whole = None
        self._checkpoint_length = 0
        self.forwards = 0
        self.hidden = None
        self.kv_states = None
        self._prefill = None
        if self.own_cache and self.use_cache:
            _refuse_own_cache(self.model, self.own_cache)
        # A shared prefill kept no hidden states: a model that must keep them prefills itself.
        prepared = matching_prefill(prefills, self.model, prompt) if self.use_cache and not self.keep_hidden else None
        if prepared is not None:
            return self._begin_from(prepared)
        self.cache = new_cache(self.model) if self.use_cache and not self.own_cache else None
        self._length = 0
        if self.cache is not None:
            _check_rollback_support(self.model, self.cache)
            record_past(self.cache)
        if not self.encoder_decoder:
            start = list(prompt)
        else:
            encoder = self.model.get_encoder()
            ids = torch.tensor([prompt], dtype=torch.long, device=device)
            self.encoder_outputs = encoder(input_ids=ids, attention_mask=torch.ones_like(ids), return_dict=True)
            start = [self.decoder_start_token()]
        if self.needs_snapshots and len(start) > 1:
            # Prefill all but the last token, so that no snapshot ever has to
            # cover the prompt (a restore then never re-feeds it).
            self.forward(torch.tensor([start[:-1]], dtype=torch.long, device=device), keep=1)
        return start

    def _begin_from(self, prepared) -> list[int]:
        """Begin from a copy of ``prepared`` (a ``kvcache.prefill.Prefill`` of this model and prompt)."""
        self.cache = copy.deepcopy(prepared.cache)
        self._length = prepared.length
        self._prefill = prepared
        self.encoder_outputs = prepared.encoder_outputs       # read-only: shared, not copied
        return list(prepared.prompt) if not self.encoder_decoder else [self.decoder_start_token()]

    def decoder_start_token(self) -> int:
        config = self.model.config
        start = getattr(config, "decoder_start_token_id", None)
        generation = getattr(self.model, "generation_config", None)
        if start is None and generation is not None:
            start = getattr(generation, "decoder_start_token_id", None)
        if start is None:
            start = getattr(config, "bos_token_id", None)
        if start is None:
            raise UnsupportedCacheError("this encoder-decoder model's config names no decoder start token")
        return int(start)

    @property
    def device(self) -> torch.device:
        return model_device(self.model)

    def network_stats(self) -> dict | None:
        """Requests and their times when the model is behind a server; a local model has none."""
        return None

    def compile_stats(self) -> dict:
        """This generation's path (one model's fields of the result's ``compile``): :func:`off_path`."""
        return off_path(self.compile_reason)

    @property
    def room(self) -> int | None:
        """Positions a forward may still add to this cache; None where it grows (a dynamic cache)."""
        return None

    @property
    def length(self) -> int:
        """Positions of the (decoder) sequence the cache holds."""
        return self._length if self.use_cache else 0

    @property
    def needs_snapshots(self) -> bool:
        """True when some layer cannot be cropped exactly and is snapshotted instead
        (every layer, for a cache class of the model's own)."""
        if self.own_cache:
            return self.use_cache
        return self.cache is not None and any(not _croppable(layer) for layer in _layers(self.cache))

    # --------------------------------------------------------------- forward

    def forward(self, ids: torch.Tensor, keep: int) -> torch.Tensor:
        """Feed the unseen tokens of ``ids`` (1, L); return the last ``keep`` logits, (keep, V).

        On the ``stepwise`` path, tokens fed over a non-empty cache go one per
        forward pass (each counted), and the logits of the last ``keep`` are
        concatenated: what a correct multi-token pass would have returned.
        """
        seen = self.length
        if seen >= ids.shape[1]:
            raise ValueError(f"cache holds {seen} positions, nothing new to feed of {ids.shape[1]}")
        replay = self._first_forward_key(ids, keep)
        if replay is not None and replay in self._prefill.first_forwards:
            logits, cache, length = self._prefill.first_forwards[replay]
            self.cache, self._length = copy.deepcopy(cache), length
            self.forwards += 1
            return logits.clone()
        self._hidden_rows = []
        if self.path != "stepwise" or seen == 0 or ids.shape[1] - seen == 1:
            logits = self._forward(ids, keep)
        else:
            rows = []
            for end in range(seen + 1, ids.shape[1] + 1):
                step = self._forward(ids[:, :end], 1)                        # (1, V)
                if end > ids.shape[1] - keep:
                    rows.append(step)
            logits = torch.cat(rows, dim=0)                                 # (keep, V)
        if self.keep_hidden:
            parts = self._hidden_rows
            self.hidden = (parts[0][0], torch.cat([rows for _, rows in parts], dim=0))
        if replay is not None:
            self._prefill.first_forwards[replay] = (logits.clone(), copy.deepcopy(self.cache), self._length)
        return logits

    def _first_forward_key(self, ids: torch.Tensor, keep: int) -> tuple | None:
        """The key under which this forward is kept in its prefill's ``first_forwards``, or None when
        it is not replayable: not the generation's first, not begun from a ``replay_first`` prefill,
        a cache that no longer holds exactly the prefill's positions (a drafter that fed it and did
        not drop what it fed), or a forward that must also keep hidden or shared states."""
        prepared = self._prefill
        if (prepared is None or not prepared.replay_first or self.forwards or self.keep_hidden
                or self.keep_kv_states or self.own_cache or self._length != prepared.length
                or cache_length(self.cache) != prepared.length):
            return None
        return tuple(ids[0, prepared.length:].tolist()), keep

    def _forward(self, ids: torch.Tensor, keep: int) -> torch.Tensor:
        """One forward pass over the unseen tokens of ``ids``; the last ``keep`` logits."""
        seen = self.length
        kwargs = {"use_cache": self.use_cache}
        if self.cache is not None:
            kwargs[self.cache_kw] = self.cache
        if self.logits_kw is not None:
            kwargs[self.logits_kw] = keep
        if self.encoder_decoder:
            kwargs.update(encoder_outputs=self.encoder_outputs, decoder_input_ids=ids[:, seen:])
        else:
            kwargs["input_ids"] = ids[:, seen:]
        layers = kept_layers(self.keep_hidden)
        if layers:
            kwargs["output_hidden_states"] = hidden_states_request(layers)
        if self.keep_kv_states:
            kwargs["return_shared_kv_states"] = True
        out = self.model(**kwargs)
        self.forwards += 1
        if layers:             # positions [seen, L): the rows of the tokens this pass fed
            states = out.hidden_states
            self._hidden_rows.append((seen, torch.cat([states[i][0] for i in layers], dim=-1)))
        if self.keep_kv_states:
            self.kv_states = out.shared_kv_states
        if self.use_cache:
            if self.cache is None:              # an own cache, made by the model on its first forward
                self.cache = out.get(self.cache_kw)
            self._length = ids.shape[1]
        return out.logits[0, -keep:]

    # -------------------------------------------------------------- rollback

    def checkpoint(self) -> None:
        """Snapshot the layers a crop cannot restore, before a forward that may be rejected."""
        if not self.use_cache:
            return
        self._checkpoint_length = self.length
        if self.own_cache:
            with self.stats.timing(self.device):
                self._whole = snapshot(self.cache)
            self.stats.method = "restore"
            self.stats.snapshots += 1
            return
        layers = _layers(self.cache)
        kept = [i for i, layer in enumerate(layers) if not _croppable(layer)]
        self._snapshots = {}
        if not kept:
            return
        with self.stats.timing(self.device):
            self._snapshots = {i: snapshot(layers[i]) for i in kept}
        self.stats.method = "restore"
        self.stats.snapshots += 1

    def rollback(self, length: int) -> None:
        """Keep at most the first ``length`` positions of the cache.

        Croppable layers are cropped; when the cache holds more than ``length``
        and some layers were snapshotted, those are restored and the rest are
        cropped to the checkpoint's length, so the cache is a shorter prefix.
        An exception transformers raises while cropping becomes one line
        (:class:`UnsupportedCacheError`): none escapes a rollback.
        """
        if not self.use_cache:
            return
        try:
            self._rollback(length)
        except UnsupportedCacheError:
            raise
        except Exception as e:  # noqa: BLE001  (a layer that cannot be cropped or restored)
            text = str(e).strip()
            raise UnsupportedCacheError(
                f"{type(self.model).__name__}'s cache cannot be rolled back here ({type(e).__name__}: "
                f"{text.splitlines()[0] if text else ''}); turn /cache off") from e

    def _rollback(self, length: int) -> None:
        current = self.length
        if current <= length:
            self._trim()
            return
        if self.own_cache:
            self._restore_whole(length)
            return
        if not self._snapshots:
            drop_last(self.cache, current - length)
            self._length = length
            return
        kept, drop = self._checkpoint_length, current - self._checkpoint_length
        layers = _self_attention(self.cache).layers
        with self.stats.timing(self.device):
            for i, layer in enumerate(layers):
                if i in self._snapshots:
                    layers[i] = self._snapshots[i]
                else:
                    drop_last(layer, drop)
        self._snapshots = {}
        self._length = kept
        self.stats.restores += 1
        self.stats.refed_tokens += length - kept

    def _restore_whole(self, length: int) -> None:
        """Put back the own cache of the last checkpoint (it holds a prefix of what is kept)."""
        if self._checkpoint_length > length or (self._whole is None and self._checkpoint_length):
            raise UnsupportedCacheError(
                f"{type(self.model).__name__}'s own {self.own_cache} cannot be cropped, and no snapshot "
                f"holds {length} positions; turn /cache off")
        with self.stats.timing(self.device):
            self.cache, self._whole = self._whole, None
        self._length = self._checkpoint_length
        self.stats.restores += 1
        self.stats.refed_tokens += length - self._checkpoint_length

    # ------------------------------------------------------------ token trees

    def attention_kinds(self) -> dict[str, int | None]:
        """The kinds of attention layer the cache holds: {"full_attention": None,
        "sliding_attention": window}, either or both."""
        kinds: dict[str, int | None] = {}
        for layer in _layers(self.cache):
            if getattr(layer, "is_sliding", False):
                kinds["sliding_attention"] = int(layer.sliding_window)
            else:
                kinds["full_attention"] = None
        return kinds

    def forward_masked(self, tokens: torch.Tensor, position_ids: torch.Tensor, attention_mask,
                       keep: int) -> torch.Tensor:
        """Feed ``tokens`` (1, m) after the cache with an explicit mask and positions.

        ``attention_mask``: one 4D additive mask, or a dict of them keyed by
        layer kind (see :meth:`attention_kinds`); ``position_ids``: (1, m).
        Returns the logits of the last ``keep`` positions, (keep, V). Every
        token fed stays in the cache until :meth:`keep_block` or a rollback.
        With ``keep_hidden`` the block's hidden states go to ``hidden``, one row
        per token fed, and :meth:`keep_block` keeps the rows it keeps.
        """
        kwargs = {"use_cache": True, self.cache_kw: self.cache, "input_ids": tokens,
                  "attention_mask": attention_mask, "position_ids": position_ids}
        if self.logits_kw is not None:
            kwargs[self.logits_kw] = keep
        layers = kept_layers(self.keep_hidden)
        if layers:
            kwargs["output_hidden_states"] = hidden_states_request(layers)
        out = self.model(**kwargs)
        self.forwards += 1
        if layers:             # one row per token fed, in the block's order; keep_block gathers them too
            self.hidden = (self._length, torch.cat([out.hidden_states[i][0] for i in layers], dim=-1))
        self._length += tokens.shape[1]
        return out.logits[0, -keep:]

    def keep_block(self, block: int, kept: list[int]) -> None:
        """Of the last ``block`` positions of every layer keep those at offsets
        ``kept`` (ascending, counted from the block's start), in that order.

        A gather, not a crop: the kept keys and values are moved down to the
        block's start (``index_select`` on each layer's tensors), then the
        rest of the block is dropped with the layer's own crop.

        When layers were snapshotted at the :meth:`checkpoint` before the block
        (sliding layers that record no past), a gather cannot put them back:
        the block is rolled back like a chain's (restore, crop the rest), and
        the kept tokens are re-fed with the next forward.
        """
        if self.cache is None:
            return
        self._keep_hidden_block(block, kept)
        if self._snapshots:
            self.rollback(self._length - block + len(kept))
            return
        for layer in _layers(self.cache):
            if kept:
                _gather_block(layer.keys, -2, block, kept)
                _gather_block(layer.values, -2, block, kept)
                _keep_indexer(layer, block, kept)
            drop_last(layer, block - len(kept))
        self._length += len(kept) - block

    def _keep_hidden_block(self, block: int, kept: list[int]) -> None:
        """The kept hidden states (``keep_hidden``) as :meth:`keep_block` keeps the cache: of the
        last forward's last ``block`` rows, those at ``kept``, so the rows follow the sequence."""
        if not self.keep_hidden or self.hidden is None:
            return
        start, rows = self.hidden
        if start + rows.shape[0] != self._length or rows.shape[0] < block:
            return                                  # the last forward did not feed this block
        index = torch.tensor(kept, dtype=torch.long, device=rows.device) + (rows.shape[0] - block)
        self.hidden = (start, torch.cat([rows[:rows.shape[0] - block], rows.index_select(0, index)]))

    def _trim(self) -> None:
        """Bound memory: trim buffers kept for a rollback back to their working size.

        ``crop(0)`` removes nothing but drops the sliding-window and conv
        history recorded since the last round (transformers >= 5.14).
        """
        if self._length == 0:
            return
        for layer in _layers(self.cache):
            if getattr(layer, "record_past", False) and not never_filled(layer):
                drop_last(layer, 0)


def _gather_block(tensor: torch.Tensor, dim: int, block: int, kept: list[int]) -> None:
    """Move the positions ``kept`` (offsets into the last ``block`` along ``dim``) to the block's start, in place."""
    start = tensor.shape[dim] - block
    index = torch.tensor(kept, dtype=torch.long, device=tensor.device) + start
    tensor.narrow(dim, start, len(kept)).copy_(tensor.index_select(dim, index))


def _keep_indexer(layer, block: int, kept: list[int]) -> None:
    """The same gather for a sparse-attention layer's indexer keys, (B, T, D), and their
    positions, (dims, B, T) (DeepSeek-V3.2's ``DynamicIndexedLayer``); its crop drops both."""
    keys = getattr(layer, "indexer_keys", None)
    if keys is not None and keys.numel():
        _gather_block(keys, 1, block, kept)
    positions = getattr(layer, "indexer_position_ids", None)
    if positions is not None:
        _gather_block(positions, -1, block, kept)


# StaticLayer: only a kvcache.static.StaticCachedModel holds one (a CachedModel refuses it at begin).
_TREE_LAYERS = ("DynamicLayer", "DynamicSlidingWindowLayer", "DynamicIndexedLayer", "StaticLayer")


def tree_support(cached: CachedModel) -> str | None:
    """None when ``cached`` can verify a token tree in one pass, else why not (one line).

    Decided from what the model reports after :meth:`CachedModel.begin`, the
    first obstacle found in this order: the cache turned off; an
    encoder-decoder forward that takes no decoder position ids (siblings must
    share a position); an attention implementation that takes no custom 4D
    mask; cache layers other than attention (a recurrent or conv state cannot
    hold branches: read from the model's own cache, or from an empty one built
    for it when it runs without); a cached forward the probe found wrong (a
    tree is a multi-token pass over the cache); no ``position_ids``; sliding
    layers with different windows; full and sliding layers without per-kind
    masks (``config.layer_types``). Sliding layers that cannot record their
    past (older transformers, 4.57 among them) take trees: they are
    snapshotted before the verify and restored after it, like a chain's.
    """
    if not isinstance(cached, CachedModel):     # a session its model made (SessionModel) says why not
        return cached.tree_reason
    model = cached.model
    if cached.cache_off:
        return "the cache is off"
    params = inspect.signature(model.forward).parameters
    if cached.encoder_decoder:
        if "decoder_position_ids" not in params:
            return f"{type(model).__name__} takes no decoder position ids (a tree's siblings share a position)"
        return "encoder-decoder tree verification is not built here"
    if cached.own_cache:
        return f"{cached.own_cache}, a cache class of the model's own: a recurrent or conv state cannot hold branches"
    impl = getattr(model.config, "_attn_implementation", None) or "eager"
    if impl not in ("eager", "sdpa"):
        return f"attention implementation {impl!r} takes no custom mask"
    layers = _layers(cached.cache if cached.cache is not None else new_cache(model))
    odd = sorted({type(layer).__name__ for layer in layers if type(layer).__name__ not in _TREE_LAYERS})
    if not layers:
        return "its cache has no layers to hold a tree"
    if odd:
        named = [n for n in odd if n != "DummyLayer"] or odd
        return f"{', '.join(named)} cache layers: a recurrent or conv state cannot hold branches"
    if cached.path != "cached":
        return f"its cached forward is not exact, so it runs {cached.path} ({cached.reason})"
    if "position_ids" not in params:
        return f"{type(model).__name__} takes no position ids"
    windows = {int(layer.sliding_window) for layer in layers if getattr(layer, "is_sliding", False)}
    if len(windows) > 1:
        return "sliding layers with different windows"
    kinds = cached.attention_kinds()
    if len(kinds) > 1 and not getattr(model.config, "layer_types", None):
        return "full and sliding layers without per-kind masks"
    return None
