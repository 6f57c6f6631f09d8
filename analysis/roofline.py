"""A forward's cost on a machine that is not this one: a roofline with a per-forward overhead.

A forward of B sequences of w new tokens over a cache of L tokens reads the weights once and every
sequence's cache and does 2 x parameters + 4 x layers x hidden x L FLOPs per new token:

    T(B, w, L) = overhead + max(bytes / bandwidth, FLOPs / peak)        (overlapped)
    T(B, w, L) = overhead + bytes / bandwidth + FLOPs / peak            (not overlapped)

and the overhead is a fixed part plus a part per layer (an eager forward's kernel launches grow
with its layers: a one-layer drafter head pays a thirty-second of a 32-layer target's).

The cards' profiles are not overlapped: at batch 1 the two forms agree, and a verify of tens of
tokens near the card's ridge point (where its bytes and FLOPs take about as long) reaches far less
than both peaks at once; priced overlapped, Spec-Bench's wide-verify methods came out about free
(docs/results.md). The cards' figures are their published ones; a forward reaches less of them, so
a profile of this machine is fitted to forwards timed here (:func:`fit_profile`, overlapped) and
checked on others (:func:`errors`). Plain numbers, no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class ModelShape:
    """What a forward's cost depends on: ``parameters``, bytes per weight (``weight_bytes``: 4
    float32, 2 bfloat16, 1 int8), ``layers``, ``hidden`` (the width attention's products run at),
    ``kv_bytes_per_token`` (keys and values one token keeps in every layer) and the dtype the
    arithmetic runs in (a key of :attr:`MachineProfile.peak_flops`)."""

    parameters: int
    weight_bytes: float
    layers: int
    hidden: int
    kv_bytes_per_token: float
    dtype: str = "bfloat16"

    def bytes_moved(self, batch: int, width: int, context: int) -> float:
        """Weights read once; every sequence's cache read; the new tokens' keys and values written."""
        return (self.parameters * self.weight_bytes
                + batch * (context + width) * self.kv_bytes_per_token)

    def flops(self, batch: int, width: int, context: int) -> float:
        tokens = batch * width
        return tokens * (2.0 * self.parameters + 4.0 * self.layers * self.hidden * (context + width))


@dataclass(frozen=True)
class MachineProfile:
    """A machine: ``bandwidth`` (bytes/s), ``peak_flops`` by dtype (FLOP/s), ``overhead_s`` a
    forward and ``overhead_per_layer_s`` more for each of its layers (a forward with no layer, a
    head's, pays one layer's), whether memory and arithmetic ``overlap`` (the larger of the two
    times) or not (their sum), and where the figures come from (``source``: a datasheet, or "fitted
    to forwards timed here")."""

    name: str
    bandwidth: float
    peak_flops: Mapping[str, float]
    overhead_s: float
    source: str
    notes: tuple[str, ...] = field(default=())
    overhead_per_layer_s: float = 0.0
    overlap: bool = True

    def overhead_for(self, shape: ModelShape) -> float:
        """A forward's overhead for ``shape``: the fixed part and its layers' launches."""
        return self.overhead_s + self.overhead_per_layer_s * max(shape.layers, 1)

    def forward_s(self, shape: ModelShape, batch: int, width: int, context: int) -> float:
        peak = self.peak_flops.get(shape.dtype) or max(self.peak_flops.values())
        memory = shape.bytes_moved(batch, width, context) / self.bandwidth
        arithmetic = shape.flops(batch, width, context) / peak
        return self.overhead_for(shape) + (max(memory, arithmetic) if self.overlap else memory + arithmetic)

    def describe(self, shape: ModelShape | None = None) -> str:
        """The overhead and the form in words, for a caption: "overhead 125 µs a layer (4.0 ms a
        forward of this 32-layer target); memory and arithmetic not overlapped"."""
        if self.overhead_per_layer_s:
            out = f"overhead {self.overhead_per_layer_s * 1e6:.0f} µs a layer"
            if self.overhead_s:
                out += f" + {self.overhead_s * 1e3:.1f} ms"
            if shape is not None:
                out += f" ({self.overhead_for(shape) * 1e3:.1f} ms a forward of this {shape.layers}-layer target)"
        else:
            out = f"overhead {self.overhead_s * 1e3:.1f} ms a forward"
        return out + ("; memory and arithmetic overlapped" if self.overlap else "; memory and arithmetic not overlapped")

    def to_dict(self) -> dict:
        return {"name": self.name, "bandwidth_GBps": round(self.bandwidth / 1e9, 3),
                "peak_TFLOPs": {k: round(v / 1e12, 3) for k, v in self.peak_flops.items()},
                "overhead_us": round(self.overhead_s * 1e6, 2),
                "overhead_per_layer_us": round(self.overhead_per_layer_s * 1e6, 3),
                "overlap": self.overlap, "source": self.source}


_TB = 1e12
# Published dense (no sparsity) tensor-core figures. The overhead is an eager transformers decode
# step's launches, tens of kernels a layer at a few microseconds each: 125 µs a layer (4 ms for a
# 32-layer model) on any of these cards; the captured path's is about a thirteenth of it (0.3 ms a
# 32-layer forward). Memory and arithmetic are not overlapped (the module's docstring says why).
EAGER_PER_LAYER_S = 4e-3 / 32
CAPTURED_PER_LAYER_S = 0.3e-3 / 32


def _card(name: str, bandwidth: float, peaks: dict[str, float], source: str) -> MachineProfile:
    return MachineProfile(name, bandwidth, peaks, 0.0, source, overhead_per_layer_s=EAGER_PER_LAYER_S, overlap=False)


PROFILES: dict[str, MachineProfile] = {p.name: p for p in (
    _card("H200", 4.8 * _TB, {"bfloat16": 989 * _TB, "float16": 989 * _TB, "float32": 67 * _TB},
          "NVIDIA H200 datasheet (SXM: 4.8 TB/s HBM3e, 989 TFLOPS BF16 dense)"),
    _card("H100", 3.35 * _TB, {"bfloat16": 989 * _TB, "float16": 989 * _TB, "float32": 67 * _TB},
          "NVIDIA H100 datasheet (SXM: 3.35 TB/s HBM3, 989 TFLOPS BF16 dense)"),
    _card("A100", 2.039 * _TB, {"bfloat16": 312 * _TB, "float16": 312 * _TB, "float32": 19.5 * _TB},
          "NVIDIA A100 datasheet (80 GB SXM: 2,039 GB/s HBM2e, 312 TFLOPS BF16 dense)"),
    _card("L40S", 0.864 * _TB, {"bfloat16": 362 * _TB, "float16": 362 * _TB, "float32": 91.6 * _TB},
          "NVIDIA L40S datasheet (864 GB/s GDDR6, 362 TFLOPS BF16 dense)"),
    _card("RTX3090", 0.936 * _TB, {"bfloat16": 71 * _TB, "float16": 71 * _TB, "float32": 35.6 * _TB},
          "NVIDIA GA102 whitepaper (RTX 3090: 936 GB/s GDDR6X, 71 TFLOPS FP16 tensor with FP32 "
          "accumulate, dense)"),
)}


def captured(profile: MachineProfile) -> MachineProfile:
    """``profile`` with the captured path's overhead a layer (CUDA graphs replay a forward's launches
    as one) in place of its own; named so ("H100 (captured)")."""
    if profile.name.endswith(" (captured)"):
        return profile
    return replace(profile, name=f"{profile.name} (captured)", overhead_s=0.0,
                   overhead_per_layer_s=CAPTURED_PER_LAYER_S)


def for_path(profile: MachineProfile, path: str | None) -> MachineProfile:
    """``profile`` as a run on compile ``path`` would meet it: ``graphs`` (captured forwards) pays the
    captured path's launches (:func:`captured`), any other path (``off``, ``static``, none) the eager ones."""
    return captured(profile) if path == "graphs" else profile


def profile_named(name: str) -> MachineProfile:
    """The profile ``name`` (case and a "-" or "_" aside); ``ValueError`` naming the known ones."""
    wanted = name.replace("-", "").replace("_", "").lower()
    for key, profile in PROFILES.items():
        if key.lower() == wanted:
            return profile
    raise ValueError(f"no machine profile {name!r} (known: {', '.join(PROFILES)})")


def fit_profile(shape: ModelShape, timed: Mapping[tuple[int, int], float], context: int, name: str,
                steps: int = 200) -> MachineProfile:
    """This machine as a profile (overlapped, one overhead a forward): the overhead, bandwidth and
    peak that price ``timed`` (``{(B, w): seconds}``) with the smallest worst relative error. For an overhead o each forward bounds the
    bandwidth by bytes / (seconds - o) and the peak by FLOPs / (seconds - o), and on a roofline the
    largest bounds are the machine's; ``steps`` overheads from 0 to the fastest forward are tried."""
    fastest = min(timed.values(), default=0.0)
    best: tuple[float, MachineProfile] | None = None
    for i in range(steps):
        overhead = fastest * i / steps
        bandwidth = max(shape.bytes_moved(b, w, context) / (s - overhead) for (b, w), s in timed.items())
        peak = max(shape.flops(b, w, context) / (s - overhead) for (b, w), s in timed.items())
        candidate = MachineProfile(name, bandwidth, {shape.dtype: peak}, overhead, "fitted to forwards timed here")
        worst = max(errors(candidate, shape, timed, context).values())
        if best is None or worst < best[0]:
            best = (worst, candidate)
    if best is None:
        raise ValueError("no timed forward to fit a profile to")
    return best[1]


def errors(profile: MachineProfile, shape: ModelShape, timed: Mapping[tuple[int, int], float],
           context: int) -> dict[tuple[int, int], float]:
    """The profile's relative error against each timed forward: |model - timed| / timed."""
    return {(b, w): abs(profile.forward_s(shape, b, w, context) - s) / s for (b, w), s in timed.items()}
