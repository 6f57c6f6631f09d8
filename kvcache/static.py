"""The static-cache path: a preallocated cache rolled back by resetting its length, and the
captured (compiled) forwards that run over it (``docs/static.md``).

Three paths (``utils.options.COMPILE_PATHS``), chosen per strategy:

- ``off``: the dynamic cache of :mod:`kvcache.cache`, unchanged;
- ``static``: transformers' ``StaticCache`` of a fixed ``capacity``, every forward eager;
  a rollback resets the length (the keys past it stay, hidden from later queries by
  causality, and the next forward overwrites them); a tree's kept path is gathered at its
  absolute positions ``[length - block, length)``;
- ``graphs``: the static path whose forwards over a non-empty cache (a decode step, a
  verify, a drafter's step, a tree) run through a compiled callable captured for a fixed
  set of widths (:data:`BUCKETS`, as serving engines keep capture sizes): a forward of
  width w runs in the smallest bucket >= w, padded, and the padded rows are rolled back
  (:meth:`StaticCachedModel._captured`); captured once per (model, bucket, capacity) and
  kept across runs; the prefill stays eager.

How the length is reset depends on the release: from transformers 5.17 a ``StaticLayer``
keeps the length it writes at (``cumulative_length``), which 5.24's ``crop(-n)`` lowers; 5.17
and 5.18 give the layer no ``crop``. On either, the engine lowers that length in place, all
5.24's ``crop`` does (:func:`lower_layer`), every layer at once in a rollback (:func:`lower_length`);
on 4.57 a layer writes where the forward's ``cache_position`` says,
so every forward passes its positions and a rollback only lowers :attr:`CachedModel.length`.
Whatever the release, each model's rollback is tried once (:func:`_static_probe`) before its
first static run; a model whose episode fails is refused in one line that names the release.

The capacity (:func:`static_capacity`) is the prompt, the length budget and the widest
verify, rounded up to a multiple of :data:`CAPACITY_STEP` (256), so one capture serves every
prompt whose need rounds to the same capacity.
"""

from __future__ import annotations

import inspect
import time
import weakref
from dataclasses import dataclass, field

import torch
import transformers
from transformers import StaticCache

from kvcache.cache import (CachedModel, SessionModel, UnsupportedCacheError, _layers,
                           _own_cache_class, hidden_states_request, kept_layers, tree_support, view_of)
from kvcache import probe
from utils.devices import synchronize
from utils.options import COMPILE_PATHS

CAPACITY_STEP = 256          # capacities are rounded up to a multiple of this
# The compile backend and mode of the ``graphs`` path: a module-level setting (tests set a cheap
# backend: "eager", or a callable that counts). The mode applies to "inductor" on CUDA only
# ("reduce-overhead": CUDA graphs); elsewhere inductor compiles in its default mode.
BACKEND: object = "inductor"
MODE = "reduce-overhead"
RECOMPILE_LIMIT = 1024       # every capture shares one code object; dynamo's default limit is 8
KEEP_CAPACITIES = 2          # static caches (and their captures) kept per model and slot
# The widths the ``graphs`` path captures (those up to the capacity): a forward runs in the smallest
# bucket that holds it, padded; a wider one runs eager (counted in the record's ``eager``).
BUCKETS = (1, 2, 4, 8, 16, 32, 64)
PAD_ID = 0                   # the token a padded row feeds: any id of the vocabulary (its row is dropped)


def _length_in_cache() -> bool:
    """Whether the installed ``StaticLayer`` keeps its own length (5.24: ``cumulative_length``)."""
    from transformers.cache_utils import StaticLayer
    try:
        return hasattr(StaticLayer(max_cache_len=1), "cumulative_length")
    except TypeError:
        return False


# From 5.17 a layer writes at its own length (``cumulative_length``); before, where the forward's
# ``cache_position`` says (4.57), which every forward passes.
LENGTH_IN_CACHE = _length_in_cache()


def lower_layer(layer, n: int) -> None:
    """Remove the last ``n`` positions of one static layer that keeps its own length: its
    ``cumulative_length`` lowered in place, all 5.24's ``crop(-n)`` does and what 5.17 and 5.18, whose
    layer has no ``crop``, need (the tensor keeps its address, which captures read; the keys past it
    stay, and the next write overwrites them). A layer never written holds nothing."""
    if n <= 0 or not getattr(layer, "is_initialized", True):
        return
    layer.cumulative_length.sub_(n)


def lower_length(cache, n: int) -> None:
    """Remove the last ``n`` positions of every layer of a static ``cache``: :func:`lower_layer` for every
    written layer at once, one foreach subtraction (a subtraction a layer is a launch a layer in every
    rollback). Nothing to remove is nothing done (no zero subtracted)."""
    if n <= 0:
        return
    lengths = [layer.cumulative_length for layer in _layers(cache) if getattr(layer, "is_initialized", True)]
    if lengths:
        torch._foreach_sub_(lengths, n)


def default_compile(device) -> str:
    """The path a strategy runs when none is asked for: ``graphs`` on CUDA, ``off`` elsewhere."""
    return "graphs" if torch.device(device).type == "cuda" else "off"


def bucket_of(width: int, capacity: int) -> int | None:
    """The smallest bucket of :data:`BUCKETS` (those up to ``capacity``) that holds ``width``;
    None when every bucket is narrower (that forward runs eager)."""
    return next((b for b in BUCKETS if width <= b <= capacity), None)


def static_capacity(prompt: int, max_gen_len: int, widest: int = 0) -> int:
    """The capacity of one generation's static cache: a ``prompt`` of that many tokens, the length
    budget, the most positions one verify feeds past it (``widest``: a tree's nodes, lookahead's
    window rows) and one, rounded up to a multiple of :data:`CAPACITY_STEP`."""
    positions = prompt + max_gen_len + widest + 1
    return max(CAPACITY_STEP, -(-positions // CAPACITY_STEP) * CAPACITY_STEP)


# ------------------------------------------------------------ what a model keeps

@dataclass
class _Kept:
    """What the process keeps of one model on the static path (:func:`kept`): decided and built once."""

    refusal: str | None = None      # why it cannot take the static path ("": it can; None: not tried yet)
    graphs_refusal: str = ""        # why its forwards cannot be captured (the backend failed once): static on
    # (capacity, slot) -> StaticCache: one preallocated cache per capacity and slot ("target", "drafter"),
    # reused by every run (captured forwards hold its tensors' addresses), the most recently used last
    caches: dict = field(default_factory=dict)
    captures: dict = field(default_factory=dict)    # (slot, capacity, bucket, masked, layers) -> _Capture

    def cache_for(self, config, capacity: int, slot: str):
        """The cache of ``capacity`` in ``slot``, now the most recently used; at most
        :data:`KEEP_CAPACITIES` capacities are kept per slot: the least recently used goes, with its
        captures (they read its tensors), so memory stays bounded when prompts grow."""
        key = (capacity, slot)
        cache = self.caches.pop(key, None)
        if cache is None:
            cache = StaticCache(config=config, max_cache_len=capacity)
            held = [k for k in self.caches if k[1] == slot]
            for old in held[:max(0, len(held) - KEEP_CAPACITIES + 1)]:
                del self.caches[old]
                for gone in [c for c in self.captures if c[:2] == (slot, old[0])]:
                    del self.captures[gone]
        self.caches[key] = cache            # dicts keep insertion order: the last is the most recent
        return cache


_KEPT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()     # model -> _Kept


def kept(model) -> _Kept:
    """What the process keeps of ``model`` on the static path (empty at first)."""
    return _KEPT.setdefault(model, _Kept())


# ------------------------------------------------------------------ refusals

def static_refusal(model) -> str | None:
    """None when ``model`` can take the static path, else why not (one line). Decided once per
    model, from what it reports and what a short static episode measures (:func:`_static_probe`)."""
    if isinstance(model, SessionModel):
        return "its cache is the server's"
    entry = kept(model)
    if entry.refusal is None:
        entry.refusal = _refusal(model) or ""
    return entry.refusal or None


def _refusal(model) -> str | None:
    name = type(model).__name__
    if getattr(model.config, "is_encoder_decoder", False):
        return f"{name} is an encoder-decoder model: the static path holds one decoder-only cache"
    own = _own_cache_class(model)
    if own:
        return f"{name} keeps its state in its own {own}: a static cache cannot hold it"
    params = inspect.signature(model.forward).parameters
    if not LENGTH_IN_CACHE and "cache_position" not in params:
        return (f"transformers {transformers.__version__}'s static cache cannot be rolled back by length "
                f"({name} takes no cache_position)")
    try:
        cache = StaticCache(config=model.config, max_cache_len=8)
    except Exception as e:  # noqa: BLE001  (transformers cannot build a static cache for it)
        return f"transformers {transformers.__version__} builds no static cache for {name} ({_first_line(e)})"
    odd = sorted({type(layer).__name__ for layer in _layers(cache) if type(layer).__name__ != "StaticLayer"})
    if any("LinearAttention" in n for n in odd):
        return f"{', '.join(odd)} cache layers: a recurrent or conv state cannot be rolled back by length"
    if any("Sliding" in n for n in odd):
        return f"sliding-window layers ({', '.join(odd)}): a window that has moved on cannot be rolled back by length"
    if odd:
        return f"{', '.join(odd)} cache layers: the static path rolls back plain attention layers only"
    if not _layers(cache):
        return "its static cache has no layers"
    found = probe.probe_of(model)
    if found.path != "cached":
        return f"its cached forward is not exact (the probe chose {found.path})"
    return _static_probe(model)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"


def _static_probe(model) -> str | None:
    """The probe's speculative-shaped episode (prefill, step, verify, rollback, verify, rollback,
    step) on the static path, held to the uncached logits (``kvcache.probe.check_episode``)."""
    capacity = probe.LENGTH + 8
    try:
        found = probe.check_episode(model, StaticCachedModel(model, capacity=capacity, slot="probe"))
    finally:
        kept(model).caches.pop((capacity, "probe"), None)
    return None if found is None else f"its static-cache forward on transformers {transformers.__version__} {found}"


# ------------------------------------------------------------------ captures

def _step(model, cache, cache_kw: str, tokens, positions, cache_position, mask, request, layers):
    """One forward over the static cache: every row's logits (1, w, V) and the kept hidden rows."""
    kwargs = {"input_ids": tokens, "position_ids": positions, cache_kw: cache, "use_cache": True}
    if cache_position is not None:
        kwargs["cache_position"] = cache_position
    if mask is not None:
        kwargs["attention_mask"] = mask
    if layers:
        kwargs["output_hidden_states"] = request
    out = model(**kwargs)
    hidden = torch.cat([out.hidden_states[i][0] for i in layers], dim=-1) if layers else None
    return out.logits, hidden


@dataclass
class _Capture:
    """One compiled forward of a bucket's width b and its static input buffers (copied in, padded,
    before each call)."""

    fn: object
    tokens: torch.Tensor            # (1, b)
    positions: torch.Tensor         # (1, b)
    mask: torch.Tensor | None       # (1, 1, b, capacity): a tree's, or a chain's causal one; None: the model's own
    slots: torch.Tensor | None      # (b,) the cache slots written, where the forward takes them (4.57)
    calls: int = 0
    strip: torch.Tensor | None = None   # (b, 2 * capacity): a chain's causal rows at every length (causal_strip)


def causal_strip(rows: int, capacity: int, dtype: torch.dtype, device) -> torch.Tensor:
    """(rows, 2 * capacity): row i open (0) up to column ``capacity + i`` and closed (the dtype's lowest)
    after, so the window of ``capacity`` columns from ``capacity - length`` is a chain's causal mask
    over the slots at that length: row i sees the slots up to ``length + i``."""
    columns = torch.arange(2 * capacity, device=device).view(1, -1)
    closed = columns > (capacity + torch.arange(rows, device=device)).view(-1, 1)
    return torch.zeros((rows, 2 * capacity), dtype=dtype, device=device).masked_fill_(closed, torch.finfo(dtype).min)


def unique_graphs() -> int:
    """Graphs dynamo has compiled in this process (a capture or a recompile adds one or more)."""
    from torch._dynamo.utils import counters
    return int(counters["stats"]["unique_graphs"])


def _compiled(device: torch.device):
    config = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit"):
        if hasattr(config, name):
            setattr(config, name, max(getattr(config, name), RECOMPILE_LIMIT))
    mode = MODE if BACKEND == "inductor" and device.type == "cuda" else None
    return torch.compile(_step, backend=BACKEND, mode=mode, dynamic=False)


@dataclass
class CompileRecord:
    """What one generation's static model compiled and ran captured (its ``graphs`` forwards)."""

    widths: set = field(default_factory=set)    # widths run captured (captured now or by an earlier run)
    buckets: set = field(default_factory=set)   # the buckets they ran in
    captures: int = 0                           # one per bucket new to the model (two: chains apart)
    capture_s: float = 0.0                      # excluded from the run's seconds
    recompiles: int = 0                         # graphs compiled after a bucket's capture: 0 is right
    eager: int = 0                              # forwards over a non-empty cache run eager: no bucket fits


# ------------------------------------------------------------- the model

class StaticCachedModel(CachedModel):
    """A :class:`CachedModel` over a preallocated ``StaticCache`` of ``capacity`` positions.

    ``rollback`` and ``keep_block`` reset the length; ``forward_masked`` (a tree) takes the
    4D mask over the cache and the block and pads it to the capacity's keys. With ``graphs``
    every forward over a non-empty cache runs captured (:meth:`_captured`). ``slot`` names
    whose cache this is ("target", "drafter"): a model decoding beside itself keeps two.
    """

    def __init__(self, model, *, capacity: int, graphs: bool = False, slot: str = "target", fallback: str = ""):
        super().__init__(model, path="cached")
        self.capacity = int(capacity)
        self.graphs = graphs
        self.slot = slot
        self.compile_path = "graphs" if graphs else "static"
        self.fallback = fallback        # why graphs were asked for and this runs static ("" when not)
        self.record = CompileRecord()
        # A chain runs in its bucket's tree capture, under a causal mask, where the model takes a 4D
        # mask: one capture per bucket serves both (decided at ``begin``).
        self.masked_chains = False

    def begin(self, prompt: list[int], prefills: tuple = ()) -> list[int]:
        """Start a generation from ``prompt`` (shared prefills are dynamic caches: not used)."""
        if len(prompt) > self.capacity:
            raise UnsupportedCacheError(f"the prompt's {len(prompt)} tokens do not fit a static cache of "
                                        f"{self.capacity} positions")
        self.stats = self._fresh_stats()
        self.forwards = 0
        self.hidden = None
        self.kv_states = None
        self.record = CompileRecord()
        self.cache = kept(self.model).cache_for(self.model.config, self.capacity, self.slot)
        self._reset(0)                             # from what the last generation on this cache left
        self.masked_chains = self.graphs and tree_support(self) is None
        return list(prompt)

    def _reset(self, length: int) -> None:
        """Put every layer back to ``length`` positions, each from the length it holds: a forward that
        failed part-way, or a self-drafter's over some layers only, may have left them apart."""
        if LENGTH_IN_CACHE:
            for layer in _layers(self.cache):
                lower_layer(layer, int(layer.get_seq_length()) - length)
        self._length = length

    def _set_length(self, length: int) -> None:
        """Reset the length to ``length`` (at most the length held): later forwards write from there.
        The cache's own length equals the one kept here, so nothing is read back from the device."""
        if LENGTH_IN_CACHE:
            lower_length(self.cache, self._length - length)
        self._length = length

    @property
    def room(self) -> int:
        return self.capacity - self._length

    def _room(self, end: int) -> None:
        if end > self.capacity:
            raise UnsupportedCacheError(f"a forward needs {end} positions of a static cache of {self.capacity}")

    # --------------------------------------------------------------- forward

    def _forward(self, ids: torch.Tensor, keep: int) -> torch.Tensor:
        seen = self._length
        tokens = ids[:, seen:]
        width = tokens.shape[1]
        self._room(seen + width)
        logits, hidden = self._run(tokens, seen, None)          # a chain: positions seen, seen + 1, ...
        self.forwards += 1
        if hidden is not None:
            self._hidden_rows.append((seen, hidden))
        self._length = seen + width
        return logits[0, -keep:]

    def forward_masked(self, tokens: torch.Tensor, position_ids: torch.Tensor, attention_mask,
                       keep: int) -> torch.Tensor:
        """Feed ``tokens`` (1, m) with ``attention_mask`` (1, 1, m, length + m), padded here to
        the capacity's keys (the positions past the block are hidden)."""
        if isinstance(attention_mask, dict):
            raise UnsupportedCacheError("a static cache takes one attention mask (no sliding layers)")
        seen, m = self._length, tokens.shape[1]
        self._room(seen + m)
        mask = attention_mask.new_full((1, 1, m, self.capacity), torch.finfo(attention_mask.dtype).min)
        mask[..., :attention_mask.shape[-1]] = attention_mask
        logits, hidden = self._run(tokens, position_ids, mask)
        self.forwards += 1
        if hidden is not None:
            self.hidden = (seen, hidden)
        self._length = seen + m
        return logits[0, -keep:]

    def _run(self, tokens, positions, mask):
        """Logits (1, w, V) and the kept hidden rows of one forward: captured in its bucket over a
        non-empty cache on the ``graphs`` path, else eager. ``positions``: the rows' position ids (1, w),
        or an int, the first of a chain's consecutive ones (written straight into a capture's buffer)."""
        layers = kept_layers(self.keep_hidden)
        if self.graphs and self._length > 0:
            bucket = self._bucket(tokens.shape[1])
            if bucket is not None:
                return self._captured(tokens, positions, mask, layers, bucket)
            self.record.eager += 1
        return self._eager(tokens, positions, mask, layers)

    def _bucket(self, width: int) -> int | None:
        """The bucket a forward of ``width`` runs in; None (eager) when it is wider than every bucket
        or its padded rows would pass the capacity."""
        bucket = bucket_of(width, self.capacity)
        return bucket if bucket is not None and self._length + bucket <= self.capacity else None

    def _eager(self, tokens, positions, mask, layers):
        """One eager forward over the static cache."""
        if isinstance(positions, int):
            positions = torch.arange(positions, positions + tokens.shape[1], device=tokens.device).view(1, -1)
        cache_position = None if LENGTH_IN_CACHE else self._slots(tokens.shape[1], tokens.device)
        return _step(self.model, self.cache, self.cache_kw, tokens, positions, cache_position, mask,
                     hidden_states_request(layers) if layers else None, layers)

    def _capture(self, bucket: int, masked: bool, layers: tuple) -> tuple[_Capture, bool]:
        """The capture of this bucket (made now if none is kept), and whether it is new."""
        captures = kept(self.model).captures
        key = self._capture_key(bucket, masked, layers)
        if key in captures:
            return captures[key], False
        device = self.device
        mask = None
        if masked:
            dtype = self.model.get_input_embeddings().weight.dtype
            mask = torch.zeros((1, 1, bucket, self.capacity), dtype=dtype, device=device)
        slots = None if LENGTH_IN_CACHE else torch.zeros(bucket, dtype=torch.long, device=device)
        found = _Capture(_compiled(device), torch.zeros((1, bucket), dtype=torch.long, device=device),
                         torch.zeros((1, bucket), dtype=torch.long, device=device), mask, slots)
        if device.type == "cuda":      # fixed addresses: CUDA graphs read them without a copy
            for buffer in (found.tokens, found.positions, found.mask, found.slots):
                if buffer is not None:
                    torch._dynamo.mark_static_address(buffer)
        captures[key] = found
        return found, True

    def _slots(self, width: int, device) -> torch.Tensor:
        """The cache slots a forward of ``width`` writes (4.57's ``cache_position``): the next ``width``
        after the length, whatever the tokens' positions (a tree's siblings share one)."""
        return torch.arange(self._length, self._length + width, device=device)

    def _capture_key(self, bucket: int, masked: bool, layers: tuple) -> tuple:
        """What a capture is kept under: one per (slot, capacity, bucket, tree or chain, hidden rows)."""
        return (self.slot, self.capacity, bucket, masked, layers)

    def _fill(self, entry: _Capture, tokens, positions, mask) -> None:
        """Copy a forward's w rows into the first w of the capture's b buffers (a replay reads only
        those) and pad the rest: token :data:`PAD_ID` at the positions after the last row's, written
        to the b - w cache slots after the real ones. No real row sees those slots: a chain's mask is
        causal over the slots (each row sees the slots up to its own), a tree's shows its rows the
        cache and the block only, and each padded row of a tree sees its own slot alone. A chain's
        ``positions`` (an int, its first) go in as one arange over all b rows."""
        w, b = tokens.shape[1], entry.tokens.shape[1]
        entry.tokens[:, :w].copy_(tokens)
        if b > w:
            entry.tokens[:, w:].fill_(PAD_ID)
        if isinstance(positions, int):           # a chain from ``positions``: one arange, padded rows included
            torch.arange(positions, positions + b, out=entry.positions[0])
            if positions + b - 1 > self._last_position:
                entry.positions[0, w:].clamp_(max=self._last_position)
        else:
            entry.positions[:, :w].copy_(positions)
            if b > w:
                after = torch.arange(1, b - w + 1, device=positions.device) + positions[:, -1:]   # (1, b - w)
                entry.positions[:, w:].copy_(after.clamp_(max=self._last_position))
        if entry.slots is not None:
            torch.arange(self._length, self._length + b, out=entry.slots)
        if entry.mask is None:
            return
        if mask is None:                         # a chain in a tree's capture: causal over the slots
            self._causal(entry)
            return
        entry.mask[:, :, :w].copy_(mask)
        if b > w:
            padded = entry.mask[:, :, w:]                                           # (1, 1, b - w, capacity)
            padded.fill_(torch.finfo(padded.dtype).min)
            rows = torch.arange(b - w, device=padded.device)
            padded[0, 0, rows, rows + self._length + w] = 0

    def _causal(self, entry: _Capture) -> None:
        """Write a chain's mask of b rows from the length into the capture's mask (1, 1, b, capacity): row i
        sees the slots up to ``length + i``, so no row sees the rows after it (padded ones included). One
        copy of a window of the capture's strip, whatever the length (building the rows anew took four
        kernels a forward, each a launch on the host's clock in a decode step)."""
        b = entry.mask.shape[2]
        if entry.strip is None:
            entry.strip = causal_strip(b, self.capacity, entry.mask.dtype, entry.mask.device)
        start = self.capacity - self._length
        entry.mask[0, 0].copy_(entry.strip[:, start:start + self.capacity])

    @property
    def _last_position(self) -> int:
        """The highest position id a padded row takes: the model's last (learned position tables end there)."""
        config = getattr(self.model.config, "get_text_config", lambda: self.model.config)()
        limit = getattr(config, "max_position_embeddings", None)
        return int(limit) - 1 if limit else self.capacity

    def _captured(self, tokens, positions, mask, layers, bucket: int):
        """Copy the inputs, padded, into the bucket's static buffers and replay its compiled forward;
        keep the first w rows of its outputs and roll the padded rows back (:meth:`_unpad`). A bucket's
        first use captures it: the forward runs (compiled, warmed up, recorded), the length is reset,
        and it runs again; the capture's seconds go to ``record.capture_s``, out of the run's."""
        width, seen = tokens.shape[1], self._length
        masked = mask is not None or self.masked_chains
        entry, new = self._capture(bucket, masked, layers)
        self._fill(entry, tokens, positions, mask)
        request = hidden_states_request(layers) if layers else None
        cache_position = entry.slots
        args = (self.model, self.cache, self.cache_kw, entry.tokens, entry.positions, cache_position,
                entry.mask, request, layers)
        cuda = self.device.type == "cuda"
        if new:
            synchronize(self.device)
            begun = time.perf_counter()
            for _ in range(2 if cuda else 1):   # CUDA graph trees warm up, then record
                if cuda:
                    torch.compiler.cudagraph_mark_step_begin()
                try:
                    entry.fn(*args)
                except Exception as e:  # noqa: BLE001  (a backend that cannot compile here: static, said once)
                    return self._give_up_graphs(e, bucket, masked, mask, layers, seen, tokens, positions)
                self._unpad(seen, bucket, 0)
            synchronize(self.device)
            self.record.capture_s += time.perf_counter() - begun
            self.record.captures += 1
        if cuda:
            torch.compiler.cudagraph_mark_step_begin()
        graphs = unique_graphs()
        logits, hidden = entry.fn(*args)
        if entry.calls > 0 and unique_graphs() > graphs:
            self.record.recompiles += 1
        entry.calls += 1
        self._unpad(seen, bucket, width)
        self.record.widths.add(width)
        self.record.buckets.add(bucket)
        # A replay's outputs live in the graph's own memory, overwritten by its next replay.
        return logits[:, :width].clone(), (hidden[:width].clone() if hidden is not None else None)

    def _unpad(self, seen: int, bucket: int, width: int) -> None:
        """After a forward of ``bucket`` rows from ``seen``, keep the first ``width``: the length goes
        back to ``seen + width``, so the padded rows' keys are never read (they lie past every later
        query's slot until the next forward overwrites them)."""
        self._length = seen + bucket     # what the cache now holds
        self._set_length(seen + width)

    def _give_up_graphs(self, error, bucket, masked, mask, layers, seen, tokens, positions):
        """The backend could not capture this forward: nothing half-made is kept, every layer is put
        back to ``seen`` positions, the model runs ``static`` (eager) from this forward on, in this
        run and the next ones, and its runs say why in one line."""
        del kept(self.model).captures[self._capture_key(bucket, masked, layers)]
        self._reset(seen)
        reason = (f"the {BACKEND!r} backend cannot capture {type(self.model).__name__}'s forward here "
                  f"({_first_line(error)}); it runs static (eager)")
        kept(self.model).graphs_refusal = reason
        self.graphs, self.compile_path, self.fallback = False, "static", reason
        return self._eager(tokens, positions, mask, layers)

    def beside(self, model, layers: list[int] | None = None) -> StaticCachedModel:
        """``model`` drafting on this static cache (:meth:`CachedModel.beside`): fed eager over a view
        of its layers at this cache's slots, and rolled back by length like it."""
        eager = "a self-drafter's forwards on the target's cache run eager" if self.graphs else ""
        shared = StaticCachedModel(model, capacity=self.capacity, slot=self.slot, fallback=eager)
        shared.cache, shared._length = view_of(self.cache, layers), self._length
        return shared

    # -------------------------------------------------------------- rollback

    def checkpoint(self) -> None:
        """Nothing to snapshot: a rollback resets the length."""
        self._checkpoint_length = self._length

    def rollback(self, length: int) -> None:
        """Keep the first ``length`` positions (a shorter length; the keys past it are overwritten later)."""
        if length < self._length:
            self._set_length(length)

    def keep_block(self, block: int, kept: list[int]) -> None:
        """Of the last ``block`` positions keep those at offsets ``kept`` (ascending): gathered at their
        absolute positions ``[length - block, length)`` of the preallocated tensors, then the length reset."""
        self._keep_hidden_block(block, kept)
        start = self._length - block
        if kept:
            for layer in _layers(self.cache):
                for tensor in (layer.keys, layer.values):
                    index = torch.tensor(kept, dtype=torch.long, device=tensor.device) + start
                    tensor.narrow(-2, start, len(kept)).copy_(tensor.index_select(-2, index))
        self._set_length(start + len(kept))

    @property
    def capture_s(self) -> float:
        """Seconds this generation has spent capturing forwards (left out of the run's time)."""
        return self.record.capture_s

    def compile_stats(self) -> dict:
        """This generation's path and captures (the result's ``compile`` fields of one model)."""
        record = self.record
        return {"path": self.compile_path, "reason": self.fallback, "widths": sorted(record.widths),
                "buckets": sorted(record.buckets), "captures": record.captures, "capture_s": record.capture_s,
                "recompiles": record.recompiles, "eager": record.eager}


# ------------------------------------------------------------- entry point

def loop_model(model, *, use_cache: bool = True, compile: str = "off", capacity: int | None = None,
               slot: str = "target") -> CachedModel:
    """``model`` as the decoding loops feed it: on ``compile`` "static" or "graphs" a
    :class:`StaticCachedModel` of ``capacity`` positions (:func:`static_capacity`) where :func:`static_refusal` allows,
    else (and on "off") :func:`kvcache.probe.cached_model`'s dynamic path, whose ``compile_reason``
    says why (one line)."""
    if compile not in COMPILE_PATHS:
        raise ValueError(f"compile must be one of {', '.join(COMPILE_PATHS)}, got {compile!r}")
    reason = ""
    if compile != "off":
        reason = ("the cache is off" if not use_cache else static_refusal(model)
                  or ("no capacity was given" if capacity is None else ""))
    if compile == "off" or reason:
        cached = probe.cached_model(model, use_cache=use_cache)
        cached.compile_reason = reason
        return cached
    refused = kept(model).graphs_refusal if compile == "graphs" else ""
    return StaticCachedModel(model, capacity=capacity, graphs=compile == "graphs" and not refused,
                             slot=slot, fallback=refused)


def compile_report(requested: str, target: dict, drafter: dict | None = None) -> dict:
    """The result's ``compile``: what was asked, the target's path and why it differs, the drafter
    model's path (None when none ran) and why it differs, the captures of both models together, and
    each model's captures apart (``model_captures``: "target", and "drafter" when one ran)."""
    both = [target] + ([drafter] if drafter is not None else [])
    reason = target["reason"] if target["path"] != requested else ""
    return {"requested": requested, "path": target["path"], "reason": reason,
            "drafter_path": drafter["path"] if drafter is not None else None,
            "drafter_reason": drafter["reason"] if drafter is not None and drafter["path"] != requested else "",
            "widths": sorted(set().union(*(s["widths"] for s in both))),
            "buckets": sorted(set().union(*(s["buckets"] for s in both))),
            "captures": sum(s["captures"] for s in both),
            "model_captures": {name: s["captures"] for name, s in zip(("target", "drafter"), both)},
            "capture_s": sum(s["capture_s"] for s in both),
            "recompiles": sum(s["recompiles"] for s in both),
            "eager": sum(s["eager"] for s in both)}
