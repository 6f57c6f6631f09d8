"""The vocabulary two tokenizers share, as one index-aligned pair of id arrays.

Token-level intersection (TLI; Timor et al. 2025) is exact only when a drafted id and its column
of q name the same target token, so the map is two arrays sorted by drafter id,
``drafter_ids[i] <-> target_ids[i]``: gather with one, scatter with the other, the same i on both
sides. Tokens are compared by the bytes they stand for (``Ġthe``, ``▁the``, ``<0xE6>``); special
tokens are left out; among ids of one vocabulary with the same bytes an ordinary piece wins over a
byte-fallback one, then the lowest id.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache

import torch

_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@lru_cache(maxsize=1)
def byte_level_alphabet() -> dict[str, int]:
    """Byte-level BPE's printable stand-in character for each byte, inverted (char -> byte): printable
    Latin-1 bytes stand for themselves, the others are shifted to code points from 256 up."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, shift = {}, 0
    for b in range(256):
        if b in kept:
            chars[chr(b)] = b
        else:
            chars[chr(256 + shift)] = b
            shift += 1
    return chars


def _decoder_kinds(tokenizer) -> set[str]:
    """The decoder types of a fast tokenizer's backend (``ByteLevel``, ``Metaspace``, ``ByteFallback``...)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return set()
    decoder = json.loads(backend.to_str()).get("decoder") or {}
    parts = decoder.get("decoders", [decoder]) if decoder.get("type") == "Sequence" else [decoder]
    return {str(p.get("type")) for p in parts if p}


def special_ids(tokenizer) -> set[int]:
    """Ids of special tokens: the named ones and added tokens marked special."""
    ids = set(int(i) for i in tokenizer.all_special_ids)
    for token_id, added in getattr(tokenizer, "added_tokens_decoder", {}).items():
        if getattr(added, "special", False):
            ids.add(int(token_id))
    return ids


def token_surfaces(tokenizer, size: int) -> list[bytes | None]:
    """The bytes each id in ``range(size)`` stands for; None for special tokens."""
    kinds = _decoder_kinds(tokenizer)
    byte_level = "ByteLevel" in kinds
    alphabet = byte_level_alphabet()
    specials = special_ids(tokenizer)
    pieces = tokenizer.convert_ids_to_tokens(list(range(size)))
    out: list[bytes | None] = []
    for token_id, piece in enumerate(pieces):
        if piece is None:
            out.append(None)
        elif (match := _BYTE_PIECE.fullmatch(piece)) and "ByteFallback" in kinds:
            out.append(bytes([int(match.group(1), 16)]))  # a byte, even where it is marked special
        elif token_id in specials:
            out.append(None)
        elif byte_level and all(c in alphabet for c in piece):
            out.append(bytes(alphabet[c] for c in piece))
        else:
            out.append(piece.replace("\u2581", " ").encode("utf-8") if "Metaspace" in kinds else piece.encode("utf-8"))
    return out


@dataclass(frozen=True)
class VocabMap:
    """Shared tokens: ``drafter_ids[i]`` and ``target_ids[i]`` (S,) are the same token, sorted by drafter id;
    ``drafter_size`` / ``target_size``: the widths of the distributions they index."""

    drafter_ids: torch.Tensor
    target_ids: torch.Tensor
    drafter_size: int
    target_size: int

    @property
    def shared(self) -> int:
        return int(self.drafter_ids.numel())

    def share_of_drafter(self) -> float:
        """Shared tokens over the drafter's vocabulary."""
        return self.shared / self.drafter_size if self.drafter_size else 0.0

    def share_of_target(self) -> float:
        return self.shared / self.target_size if self.target_size else 0.0

    def restrict(self, logits: torch.Tensor) -> torch.Tensor:
        """Drafter logits (n, Vd) with every unshared column set to -inf."""
        masked = torch.full_like(logits, float("-inf"))
        ids = self.drafter_ids.to(logits.device)
        masked[:, ids] = logits[:, ids]
        return masked

    def to_target(self, q: torch.Tensor) -> torch.Tensor:
        """Drafter probabilities (n, Vd), zero outside the shared tokens, as (n, Vt) target ones."""
        out = q.new_zeros(q.shape[0], self.target_size)
        out[:, self.target_ids.to(q.device)] = q[:, self.drafter_ids.to(q.device)]
        return out

    def target_id_of(self) -> torch.Tensor:
        """(Vd,) target id of each drafter id, -1 where it has none."""
        table = torch.full((self.drafter_size,), -1, dtype=torch.long)
        table[self.drafter_ids] = self.target_ids
        return table


def _preferred_ids(tokenizer, size: int) -> dict[bytes, int]:
    """Surface -> the id a model would emit for it: an ordinary piece before a byte-fallback
    piece (SentencePiece uses ``<0x61>`` only for text its pieces cannot spell), then the lowest."""
    pieces = tokenizer.convert_ids_to_tokens(list(range(size)))
    best: dict[bytes, tuple[bool, int]] = {}
    for token_id, surface in enumerate(token_surfaces(tokenizer, size)):
        if not surface:
            continue
        key = (bool(_BYTE_PIECE.fullmatch(pieces[token_id] or "")), token_id)
        if surface not in best or key < best[surface]:
            best[surface] = key
    return {surface: key[1] for surface, key in best.items()}


def build_vocab_map(target_tokenizer, drafter_tokenizer, *, target_size: int, drafter_size: int) -> VocabMap:
    """The shared vocabulary of two tokenizers over ids below the given sizes."""
    target_of = _preferred_ids(target_tokenizer, min(target_size, len(target_tokenizer)))
    drafter_of = _preferred_ids(drafter_tokenizer, min(drafter_size, len(drafter_tokenizer)))
    # One list of (drafter id, target id) pairs, sorted by drafter id, split into two aligned arrays.
    pairs = sorted((d, target_of[surface]) for surface, d in drafter_of.items() if surface in target_of)
    drafter_ids = torch.tensor([d for d, _ in pairs], dtype=torch.long)
    target_ids = torch.tensor([t for _, t in pairs], dtype=torch.long)
    return VocabMap(drafter_ids, target_ids, drafter_size, target_size)
