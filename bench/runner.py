"""The benchmark loop: warm-up, then every variant on every prompt, interleaved.

Order within a repeat: prompt 1 through every variant, then prompt 2, and so
on; then the next repeat, with the variants in reverse order (A B C A B C ...,
then C B A C B A ...). Machine drift during a run therefore hits every variant
alike, a variant and its peer run back to back, and which one goes first alternates.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from bench.prompts import Prompt, chat_ids
from bench.records import RunRecord
from bench.variants import Variant


@dataclass(frozen=True)
class EncodedPrompt:
    prompt: Prompt
    ids: tuple[int, ...]


@dataclass
class Skipped:
    prompt_id: str
    reason: str


def encode_prompts(prompts: Sequence[Prompt], tokenizer, *, chat: bool = True) -> list[EncodedPrompt]:
    """Token ids of every prompt, with the chat template when ``chat`` (same for all)."""
    return [EncodedPrompt(p, tuple(chat_ids(tokenizer, p.text, chat=chat))) for p in prompts]


def split_fitting(encoded: Sequence[EncodedPrompt], *, length: int,
                  context_length: int | None) -> tuple[list[EncodedPrompt], list[Skipped]]:
    """Prompts whose ids plus ``length`` new tokens fit the context, and the others."""
    kept, skipped = [], []
    for item in encoded:
        if context_length and len(item.ids) + length > context_length:
            skipped.append(Skipped(item.prompt.id, f"{len(item.ids)} prompt tokens + {length} "
                                   f"new exceed the context of {context_length}"))
        else:
            kept.append(item)
    return kept, skipped


def schedule(n_prompts: int, variants: Sequence[Variant],
             repeats: int) -> list[tuple[int, int, Variant]]:
    """(repeat, prompt index, variant) in run order: repeat, then prompt, then variant.

    Odd repeats take the variants in reverse order: pairs stay back to back, and
    which of a pair runs first alternates, so neither gains from its position.
    """
    order = [list(variants), list(reversed(variants))]
    return [(r, p, v) for r in range(repeats) for p in range(n_prompts) for v in order[r % 2]]


RunOne = Callable[..., RunRecord]   # run(variant, ids, prompt_id=, category=, repeat=)


def warm_up(run: RunOne, variants: Sequence[Variant], item: EncodedPrompt, times: int,
            on_step: Callable[[str], None] | None = None) -> None:
    """Run every variant ``times`` on one prompt and discard the results."""
    for _ in range(times):
        for variant in variants:
            if on_step:
                on_step(f"warm-up {variant.label}")
            run(variant, list(item.ids), prompt_id=item.prompt.id,
                category=item.prompt.category, repeat=-1)


def iter_runs(run: RunOne, encoded: Sequence[EncodedPrompt], variants: Sequence[Variant], *,
              repeats: int, warmup: int = 1,
              on_step: Callable[[str], None] | None = None) -> Iterator[RunRecord]:
    """Warm up, then run the whole schedule, yielding one record per timed run."""
    if encoded and warmup > 0:
        warm_up(run, variants, encoded[0], warmup, on_step)
    for repeat, index, variant in schedule(len(encoded), variants, repeats):
        item = encoded[index]
        if on_step:
            on_step(f"{variant.label} · {item.prompt.id} · repeat {repeat + 1}/{repeats}")
        yield run(variant, list(item.ids), prompt_id=item.prompt.id,
                  category=item.prompt.category, repeat=repeat)


def run_count(n_prompts: int, n_variants: int, *, repeats: int, warmup: int) -> int:
    """How many decodes a benchmark makes, warm-up included (for the progress bar)."""
    return n_variants * (warmup * (n_prompts > 0) + n_prompts * repeats)
