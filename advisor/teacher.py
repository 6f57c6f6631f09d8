"""Teacher forcing: a drafter model's greedy guesses along target AR's output, from one forward.

Under greedy, while a round's drafts equal the output the drafter's context is the output itself,
so a round starting at t accepts as many drafts as there are consecutive positions from t where the
drafter's argmax given the target's tokens is the target's token (up to γ). One uncached forward
over prompt + output gives every round start and every γ at once. That forward agrees with a run's
cached ones only where the drafter's cache is exact (:func:`teachable`, ``kvcache.probe``); drafters
of the target's state or with their own tokenizer run their own ``propose`` in ``advisor.replay``.
:class:`TeacherDrafter` serves the guesses behind the drafter contract and counts the forwards a
``ModelDrafter`` would run.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from generation.drafter import Drafter
from utils.devices import model_device

NO_TOKEN = 0    # a draft after the first wrong one: never judged (the wrong one ends the round), so any id


def rows_along(model, prompt: Sequence[int], output: Sequence[int], vocab_size: int | None = None) -> torch.Tensor:
    """``model``'s logits for each output position given the prompt and the output before it, (len(output), V):
    row i predicts ``output[i]`` (one forward over prompt + output but its last token)."""
    ids = torch.tensor([list(prompt) + list(output[:-1])], dtype=torch.long, device=model_device(model))
    with torch.inference_mode():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1:]
    return logits if vocab_size is None else logits[:, :vocab_size]


def guesses(model, prompt: Sequence[int], output: Sequence[int], vocab_size: int | None) -> tuple[int, ...]:
    """The drafter's argmax for each output position: ``guess[i]`` predicts ``output[i]`` (:func:`rows_along`)."""
    return tuple(rows_along(model, prompt, output, vocab_size).argmax(dim=-1).tolist())


def teachable(pair) -> str | None:
    """None when the pair's drafter model can be teacher-forced exactly (a plain drafter model whose
    cached forward the probe found exact and whose cache is cropped), else why not (one line)."""
    from engine.kinds import kind_of_pair
    from kvcache.probe import cached_model

    if pair.drafter is None:
        return "the pair has no drafter model"
    kind = kind_of_pair(pair)
    if kind is not None:
        return f"a {kind.name} drafter drafts from the target's state or cache, not from the prefix alone"
    cached = cached_model(pair.drafter)
    if cached.path != "cached":
        return "the drafter's cached forward is not the plain cached one (its probe), so one pass may differ"
    cached.begin([0])                   # one token: nothing is fed, the cache is made
    if cached.needs_snapshots:
        return "the drafter's cache restores snapshots (recurrent layers), re-feeding tokens as it runs"
    return None


class TeacherDrafter(Drafter):
    """A drafter model's greedy chains read from its teacher-forced guesses along one recorded output:
    up to and including its first wrong draft, then :data:`NO_TOKEN` (drafted, never judged).
    ``steps`` counts, by width, the forwards a ``ModelDrafter`` with a cropped cache would run."""

    kind = "model"

    def __init__(self, prompt: Sequence[int], output: Sequence[int], guess: Sequence[int]):
        self.start = len(prompt)
        self.output = tuple(output)
        self.guess = tuple(guess)
        self.steps: dict[int, int] = {}
        self._cached = 0        # positions the simulated drafter cache holds
        self._calls = 0
        self._committed = 0     # as ModelDrafter keeps them: the committed length,
        self._drafted = False   # whether it drafted the round in progress,
        self._trusted: int | None = None    # and the cache positions the next round may keep

    @property
    def calls(self) -> int:
        return self._calls

    def begin(self, prompt: list[int]) -> None:
        self._cached, self._calls, self.steps = 0, 0, {}
        self._committed, self._drafted, self._trusted = len(prompt), False, None

    def propose(self, ids: torch.Tensor, k: int, stop_below: float | None = None):
        if stop_below is not None:
            raise ValueError("teacher forcing knows the drafter's argmax only, not when it would stop early")
        length = ids.shape[1]
        at = length - self.start
        drafts = []
        for i in range(k):
            pos = at + i
            guess = self.guess[pos] if pos < len(self.guess) else NO_TOKEN
            drafts.append(guess)
            if pos >= len(self.output) or guess != self.output[pos]:
                drafts += [NO_TOKEN] * (k - i - 1)
                break
        self._count_steps(length, k)
        return torch.tensor(drafts, dtype=torch.long), None

    def _count_steps(self, length: int, k: int) -> None:
        """What ``ModelDrafter.propose`` runs for ``k`` drafts after a sequence of ``length``: a rollback,
        then k forwards (the first of every token the cache lacks, then one draft each)."""
        keep = length - 1 if self._trusted is None else min(length - 1, self._trusted)
        self._cached = min(self._cached, keep)
        self._drafted, self._trusted = True, None
        if k <= 0:
            return
        first = length - self._cached
        self.steps[first] = self.steps.get(first, 0) + 1
        if k > 1:
            self.steps[1] = self.steps.get(1, 0) + k - 1
        self._cached = length + k - 1
        self._calls += k

    def update(self, new_tokens: list[int], top_k: list[list[int]] | None) -> None:
        """As ``ModelDrafter.update``: after a round another drafter drafted (a hybrid's storage),
        the next proposal keeps no cache position past that round's last committed token but one."""
        if not self._drafted:
            cut = self._committed - 1
            self._trusted = cut if self._trusted is None else min(self._trusted, cut)
        self._committed += len(new_tokens)
        self._drafted = False
