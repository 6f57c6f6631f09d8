"""A lean one-token step for self-drafters of the Llama shape, on key/value buffers of its own.

A cast copy of the target (``self:bf16``, ``self:fp16``, ``self:int8=weight-only``)
drafts one token per forward. Through transformers' module tree that forward is
some 1,700 small tensor operations on the default model, a third of its time
on a 2-core CPU (docs/results.md). :class:`LeanStep` computes the same step with
the same weights in about a third of the operations:

- q, k, v in one product and gate, up in another (the layers' weights become
  views into the fused tensors, so the module tree still runs and nothing is
  held twice);
- the rotation applied to q and k together, from a table the model's own
  rotary module computed;
- grouped-query attention as one fused attention call per layer, with each key
  head's queries stacked;
- keys and values written into preallocated buffers, not concatenated.

It applies to a decoder whose layers are exactly Llama's (two RMS norms,
attention of q/k/v/o projections, a SiLU-gated MLP); :func:`lean_step` checks
that, and then checks the step numerically against the model's own cached
forward. A model that differs in either way drafts through its own forward, and
the reason is kept. Drafts only propose tokens: the target's verify decides
what is kept, so a lean drafter is as lossless as any other.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from model_drafters.selfdraft.copies import WeightOnlyInt8Linear
from kvcache.shared import committed_positions
from kvcache.cache import _forward_kwargs, new_cache

LEAN_ATTR = "lean_step"            # on a self-draft model: its LeanStep, or None
LEAN_REASON_ATTR = "lean_reason"   # why it has none ("" when it has one)
LAYER_PARTS = {"self_attn", "mlp", "input_layernorm", "post_attention_layernorm"}
ATTENTION_PARTS = {"q_proj", "k_proj", "v_proj", "o_proj"}
MLP_PARTS = {"gate_proj", "up_proj", "down_proj", "act_fn"}
# The step against the model's own cached forward, relative to the largest logit:
# a 16-bit copy computes the same sums in another order (0.01 of the scale on the
# default model); a wrong rotation, norm or scale is off by the scale itself.
TOLERANCE = {torch.float32: 1e-4, torch.float16: 0.02, torch.bfloat16: 0.05}
TRIAL_PREFIX, TRIAL_STEPS = 5, 3
LENGTH_DEPENDENT_ROPE = ("dynamic", "longrope")


class LeanRefused(Exception):
    """The model is not of the shape the lean step computes; the message says how (one line)."""


class _Fused:
    """Linear layers of one input as one product, called without the module tree; several
    layers' weights become views of the fused tensor (nothing is held twice)."""

    def __init__(self, linears: list[torch.nn.Module]):
        self.int8 = isinstance(linears[0], WeightOnlyInt8Linear)
        if len(linears) == 1:                    # one layer: its own tensors (a tied head stays tied)
            (m,) = linears
            self.weight = m.qweight if self.int8 else m.weight
            self.scale = m.scale if self.int8 else None
            self.bias = m.bias
            return
        if self.int8:
            self.weight = _fuse(linears, "qweight")
            self.scale = _fuse(linears, "scale")
        else:
            self.weight = _fuse(linears, "weight")
        self.bias = None
        if any(m.bias is not None for m in linears):
            like = next(m.bias for m in linears if m.bias is not None)
            self.bias = torch.cat([m.bias.detach() if m.bias is not None else like.new_zeros(m.out_features)
                                   for m in linears])
            _rebind(linears, "bias", self.bias)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.int8:
            out = torch.ops.aten._weight_int8pack_mm(x, self.weight, self.scale)
            return out if self.bias is None else out + self.bias
        return F.linear(x, self.weight, self.bias)


def _direct(linear):
    """``linear`` called without its module wrapper where it is a kind :class:`_Fused` takes."""
    return _Fused([linear]) if _linear_kind(linear) else linear


def _fuse(linears, name: str) -> torch.Tensor:
    fused = torch.cat([getattr(m, name).detach() for m in linears])
    _rebind(linears, name, fused)
    return fused


def _rebind(linears, name: str, fused: torch.Tensor) -> None:
    """Make each layer's ``name`` a view of its rows of ``fused`` (no second copy of the weights)."""
    start = 0
    for m in linears:
        rows = m.out_features
        view = fused[start:start + rows]
        if name in m._parameters:
            m._parameters[name] = torch.nn.Parameter(view, requires_grad=False)
        else:
            m._buffers[name] = view
        start += rows


def _linear_kind(m) -> str | None:
    if isinstance(m, WeightOnlyInt8Linear):
        return "int8"
    if type(m) is torch.nn.Linear:
        return str(m.weight.dtype)
    return None


def _eps(norm) -> float:
    for name in ("variance_epsilon", "eps"):
        if isinstance(getattr(norm, name, None), float):
            return getattr(norm, name)
    raise LeanRefused(f"{type(norm).__name__} names no epsilon")


def _is_silu(act) -> bool:
    """Whether ``act`` computes SiLU (torch's module or transformers' own class of it), by its values."""
    x = torch.linspace(-6, 6, 25)
    with torch.no_grad():
        return torch.allclose(act(x), F.silu(x))


def _check_shape(model) -> None:
    """Raise :class:`LeanRefused` unless every layer has exactly Llama's parts."""
    inner = getattr(model, "model", None)
    parts = {"embed_tokens", "layers", "norm", "rotary_emb"}
    if inner is None or not parts <= {n for n, _ in inner.named_children()} or not hasattr(model, "lm_head"):
        raise LeanRefused(f"{type(model).__name__} is not a decoder with embed_tokens, layers, norm and rotary_emb")
    config = model.config
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        raise LeanRefused("it attends through a sliding window")
    rope = getattr(inner.rotary_emb, "rope_type", "default")
    if rope in LENGTH_DEPENDENT_ROPE:      # its table changes with the sequence: one table would not do
        raise LeanRefused(f"its rotation ({rope}) changes with the sequence length")
    for layer in inner.layers:
        for module, want, what in ((layer, LAYER_PARTS, "layer"), (layer.self_attn, ATTENTION_PARTS, "attention"),
                                   (getattr(layer, "mlp", None), MLP_PARTS, "MLP")):
            have = {n for n, _ in module.named_children()} if module is not None else set()
            if have != want:
                extra = sorted(have ^ want)
                raise LeanRefused(f"its {what} differs from Llama's ({', '.join(extra)})")
        if not _is_silu(layer.mlp.act_fn):
            raise LeanRefused(f"its MLP activation ({type(layer.mlp.act_fn).__name__}) is not SiLU")
        for module, names in ((layer.self_attn, ("q_proj", "k_proj", "v_proj")), (layer.mlp, ("gate_proj", "up_proj"))):
            kinds = {_linear_kind(getattr(module, n)) for n in names}
            if None in kinds or len(kinds) != 1:
                raise LeanRefused(f"its {', '.join(names)} are not of one kind (float or weight-only int8)")


class _Layer:
    def __init__(self, layer, head_dim: int):
        attn, mlp = layer.self_attn, layer.mlp
        self.norm1, self.eps1 = layer.input_layernorm.weight, _eps(layer.input_layernorm)
        self.norm2, self.eps2 = layer.post_attention_layernorm.weight, _eps(layer.post_attention_layernorm)
        self.qkv = _Fused([attn.q_proj, attn.k_proj, attn.v_proj])
        self.o_proj = _direct(attn.o_proj)
        self.gate_up = _Fused([mlp.gate_proj, mlp.up_proj])
        self.down = _direct(mlp.down_proj)
        self.intermediate = mlp.gate_proj.out_features
        self.scale = float(getattr(attn, "scaling", head_dim ** -0.5))


class LeanStep:
    """The one-token step of a Llama-shaped model on key/value buffers holding ``length`` positions.

    ``append`` copies committed positions from the target's cache (cast);
    ``step`` feeds one token and returns its logits, (1, V); ``drop`` forgets the
    last ``n`` positions (a round's drafts).
    """

    def __init__(self, model):
        _check_shape(model)
        config = model.config
        self.model = model
        self.heads = config.num_attention_heads
        self.kv_heads = getattr(config, "num_key_value_heads", None) or self.heads
        first = model.model.layers[0].self_attn
        self.head_dim = first.q_proj.out_features // self.heads
        if first.k_proj.out_features != self.kv_heads * self.head_dim or self.heads % self.kv_heads:
            raise LeanRefused("its key heads do not divide its query heads")
        weights = [p for p in model.parameters() if p.is_floating_point()]
        self.dtype = weights[0].dtype if weights else torch.float32
        self.device = weights[0].device if weights else torch.device("cpu")
        # The keys and values held, and the attention over them: float32 for float16 weights on a CPU,
        # whose float16 attention is several times slower than its float32 (the default self-drafter's
        # attention over 4,096 positions: 49 ms a step in float16, 10 ms in float32, 30 layers, AMD EPYC
        # with avx512_bf16); the weights' own dtype elsewhere (a GPU's half-precision attention is fast).
        self.cache_dtype = (torch.float32 if self.device.type == "cpu" and self.dtype == torch.float16
                            else self.dtype)
        self.layers = [_Layer(layer, self.head_dim) for layer in model.model.layers]
        self.norm, self.eps = model.model.norm.weight, _eps(model.model.norm)
        self.head = _direct(model.lm_head)
        self.length = 0
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self._cos = self._sin = torch.empty(0, self.head_dim, dtype=self.dtype, device=self.device)

    # ---------------------------------------------------------------- state

    def clear(self) -> None:
        self.length = 0

    def drop(self, n: int) -> None:
        self.length -= n

    def append(self, positions: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Add positions: one (keys, values) pair per layer, each (1, kv_heads, n, head_dim), any
        dtype (``kvcache.shared.committed_positions`` of a cache)."""
        n = positions[0][0].shape[-2]
        self._reserve(self.length + n)
        for mine_k, mine_v, (k, v) in zip(self.keys, self.values, positions):
            mine_k[:, self.length:self.length + n].copy_(k[0])
            mine_v[:, self.length:self.length + n].copy_(v[0])
        self.length += n

    def _reserve(self, positions: int) -> None:
        have = self.keys[0].shape[1] if self.keys else 0
        if positions <= have:
            return
        size = max(positions, 2 * have, 64)
        shape = (self.kv_heads, size, self.head_dim)
        grown_k = [torch.zeros(shape, dtype=self.cache_dtype, device=self.device) for _ in self.layers]
        grown_v = [torch.zeros(shape, dtype=self.cache_dtype, device=self.device) for _ in self.layers]
        for old, new in zip(self.keys + self.values, grown_k + grown_v):
            new[:, :have].copy_(old)
        self.keys, self.values = grown_k, grown_v
        self._rotation(size)

    def _rotation(self, positions: int) -> None:
        """cos and signed sin by position, (positions, head_dim), from the model's own rotary module."""
        probe = torch.zeros(1, 1, self.head_dim, dtype=self.dtype, device=self.device)
        ids = torch.arange(positions, device=self.device)[None]
        cos, sin = self.model.model.rotary_emb(probe, ids)
        half = self.head_dim // 2
        cos, sin = cos[0], sin[0]
        if not (torch.equal(cos[:, :half], cos[:, half:]) and torch.equal(sin[:, :half], sin[:, half:])):
            raise LeanRefused("its rotation does not repeat over the two halves of a head")
        # rotate(x) = x * cos + swap_halves(x) * [-sin, sin]: one flip and one fused multiply-add
        self._cos, self._sin = cos.contiguous(), torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)

    # ----------------------------------------------------------------- step

    @torch.inference_mode()
    def step(self, token: torch.Tensor) -> torch.Tensor:
        """The logits after feeding ``token`` (a one-element id tensor) at position ``length``, (1, V)."""
        pos = self.length
        self._reserve(pos + 1)
        cos, sin = self._cos[pos], self._sin[pos]
        heads, kv, dim = self.heads, self.kv_heads, self.head_dim
        width = heads * dim
        h = self.model.model.embed_tokens(token.reshape(1, 1).to(self.device)).reshape(1, -1)
        for layer, keys, values in zip(self.layers, self.keys, self.values):
            qkv = layer.qkv(torch.rms_norm(h, h.shape[-1:], layer.norm1, layer.eps1))
            qk = qkv[:, :width + kv * dim].reshape(heads + kv, dim)
            swapped = qk.reshape(heads + kv, 2, dim // 2).flip(1).reshape(heads + kv, dim)
            qk = torch.addcmul(qk * cos, swapped, sin)
            keys[:, pos] = qk[heads:]
            values[:, pos] = qkv[0, width + kv * dim:].reshape(kv, dim)
            attended = F.scaled_dot_product_attention(
                qk[:heads].reshape(1, kv, heads // kv, dim).to(keys.dtype), keys[None, :, :pos + 1],
                values[None, :, :pos + 1], scale=layer.scale)
            h = h + layer.o_proj(attended.to(self.dtype).reshape(1, width))
            gate_up = layer.gate_up(torch.rms_norm(h, h.shape[-1:], layer.norm2, layer.eps2))
            h = h + layer.down(F.silu(gate_up[:, :layer.intermediate]) * gate_up[:, layer.intermediate:])
        self.length = pos + 1
        return self.head(torch.rms_norm(h, h.shape[-1:], self.norm, self.eps))

    @torch.inference_mode()
    def branches(self, starts: list[int], tokens: torch.Tensor, depth: int, pick, keep_logits: bool = False,
                 going=None):
        """Many greedy chains at once over the committed positions this step holds: chain b feeds
        ``tokens[b]`` at position ``starts[b]`` (each at most ``length``), then its own drafts, each
        attending to the held positions before ``starts[b]`` and to the chain's own fed tokens, as
        :meth:`step` would run once per chain after a ``drop`` back to ``starts[b]``. ``pick(logits)``
        turns rows (B, V) into the next tokens (B,); ``going(rows, j, tokens)``, where given, says
        which of the chains ``rows`` (their indices) go on after their draft ``j`` (a bool tensor):
        the others stop there. Returns the drafts (B, depth), -1 past where a chain stopped, and,
        with ``keep_logits``, every step's logits (B, depth, V; zeros past a stop). One forward per
        depth for the chains still going: the products and the attention are batched (float32
        softmax), so where a chain's logits sit at a near-tie a run's single steps can pick the other
        token. The held positions are not changed."""
        count = len(starts)
        out = torch.full((count, max(depth, 0)), -1, dtype=torch.long)
        if count == 0 or depth <= 0:
            return out, None
        if max(starts) > self.length:
            raise ValueError(f"a chain starts at {max(starts)}, past the {self.length} positions held")
        limit = max(starts)
        self._reserve(limit + depth)
        heads, kv, dim = self.heads, self.kv_heads, self.head_dim
        group, width = heads // kv, heads * dim
        rows = torch.arange(count)                                  # the chains still going
        start = torch.tensor(starts, device=self.device)
        own_k = [torch.zeros(count, kv, depth, dim, dtype=self.dtype, device=self.device) for _ in self.layers]
        own_v = [torch.zeros_like(k) for k in own_k]
        token = tokens.reshape(count).to(self.device)
        held_kv = [(k[:, :limit].float(), v[:, :limit].float()) for k, v in zip(self.keys, self.values)]   # once
        kept = None
        for j in range(depth):
            live = len(rows)
            before = (torch.arange(limit, device=self.device)[None] >= start[:, None])[:, None, None]  # masked out
            cos, sin = self._cos[start + j][:, None], self._sin[start + j][:, None]
            h = self.model.model.embed_tokens(token[:, None]).reshape(live, -1)
            for layer, (keys, values), mine_k, mine_v in zip(self.layers, held_kv, own_k, own_v):
                qkv = layer.qkv(torch.rms_norm(h, h.shape[-1:], layer.norm1, layer.eps1))
                qk = qkv[:, :width + kv * dim].reshape(live, heads + kv, dim)
                swapped = qk.reshape(live, heads + kv, 2, dim // 2).flip(2).reshape(live, heads + kv, dim)
                qk = torch.addcmul(qk * cos, swapped, sin)
                mine_k[:, :, j] = qk[:, heads:]
                mine_v[:, :, j] = qkv[:, width + kv * dim:].reshape(live, kv, dim)
                q = qk[:, :heads].reshape(live, kv, group, dim).float()
                held = torch.einsum("bkgd,kld->bkgl", q, keys) * layer.scale
                held = held.masked_fill(before, float("-inf"))
                own = torch.einsum("bkgd,bkjd->bkgj", q, mine_k[:, :, :j + 1].float()) * layer.scale
                weights = torch.softmax(torch.cat([held, own], dim=-1), dim=-1)
                attended = (torch.einsum("bkgl,kld->bkgd", weights[..., :limit], values)
                            + torch.einsum("bkgj,bkjd->bkgd", weights[..., limit:], mine_v[:, :, :j + 1].float()))
                h = h + layer.o_proj(attended.to(self.dtype).reshape(live, width))
                gate_up = layer.gate_up(torch.rms_norm(h, h.shape[-1:], layer.norm2, layer.eps2))
                h = h + layer.down(F.silu(gate_up[:, :layer.intermediate]) * gate_up[:, layer.intermediate:])
            logits = self.head(torch.rms_norm(h, h.shape[-1:], self.norm, self.eps))
            token = pick(logits).reshape(live)
            out[rows, j] = token.cpu()
            if keep_logits:
                if kept is None:
                    kept = torch.zeros(count, depth, logits.shape[-1], dtype=logits.dtype, device=logits.device)
                kept[rows.to(kept.device), j] = logits
            if going is not None and j + 1 < depth:
                on = going(rows, j, token).to(torch.bool).cpu()
                if not bool(on.all()):
                    where = on.nonzero().flatten()
                    rows, token, start = rows[where], token[where.to(token.device)], start[where.to(start.device)]
                    own_k = [k[where.to(k.device)] for k in own_k]
                    own_v = [v[where.to(v.device)] for v in own_v]
                    if len(rows) == 0:
                        break
        return out, kept


@torch.inference_mode()
def _trial(step: LeanStep) -> None:
    """Raise :class:`LeanRefused` unless the lean step's logits equal the model's own cached forward's."""
    model = step.model
    vocab = model.config.vocab_size
    ids = (torch.arange(TRIAL_PREFIX + TRIAL_STEPS, device=step.device) * 7919 + 3) % vocab
    cache, cache_kw = new_cache(model), _forward_kwargs(model)[0]
    model(input_ids=ids[None, :TRIAL_PREFIX], use_cache=True, **{cache_kw: cache})
    step.clear()
    step.append(committed_positions(cache, 0, TRIAL_PREFIX))
    for i in range(TRIAL_PREFIX, TRIAL_PREFIX + TRIAL_STEPS):
        out = model(input_ids=ids[None, i:i + 1], use_cache=True, **{cache_kw: cache})
        want = out.logits[0, -1:].float()
        got = step.step(ids[i:i + 1]).float()
        scale = want.abs().max().clamp(min=1.0)
        off = float((got - want).abs().max() / scale)
        if not off <= TOLERANCE.get(step.dtype, 0.05):
            raise LeanRefused(f"its step differs from the model's own forward by {off:.3g} of the largest logit")
    step.clear()


def lean_step(model) -> tuple[LeanStep | None, str]:
    """The model's :class:`LeanStep`, checked against its own forward, or (None, why not)."""
    try:
        step = LeanStep(model)
        _trial(step)
    except LeanRefused as exc:
        return None, str(exc)
    except (RuntimeError, TypeError, ValueError, AttributeError, IndexError) as exc:
        # a model of the right parts whose forward or rotary module takes other arguments:
        # it drafts through its own forward, and the reason says what failed
        first = (str(exc).splitlines() or [""])[0]
        return None, f"its trial step failed ({type(exc).__name__}: {first})"
    return step, ""


def attach_lean(model) -> None:
    """Build ``model``'s lean step and keep it (or the reason there is none) on the model."""
    step, reason = lean_step(model)
    object.__setattr__(model, LEAN_ATTR, step)
    object.__setattr__(model, LEAN_REASON_ATTR, reason)


def lean_of(model) -> tuple[LeanStep | None, str]:
    """(the lean step :func:`attach_lean` kept on ``model``, why it has none); (None, "") for a model
    it never saw (a layer-skip view): the one reader of the two fields this module writes."""
    kept = vars(model)
    return kept.get(LEAN_ATTR), kept.get(LEAN_REASON_ATTR, "")
