"""The hybrid drafter (``ngram_assisted.hybrid``): retrieval when the storage's match is long, the
drafter model otherwise, through the engine's one way in.

Greedy output equals target AR (chains and trees, every verify rule, each storage) with
both kinds of rounds, drafts accepted and rejected; every drafter-model round drafts what
the drafter would from the kept text, computed without a cache (a drafter whose cache kept
a rejected draft across a retrieval round must fail that check, and does); the storage
holds every token whichever side drafted (a hybrid that feeds only the drafting side fails);
under sampling the first three tokens follow the target's exact distribution (a retrieval
draft stated with the drafter model's q must fail it, and does).
"""

from __future__ import annotations

import copy

import pytest
import torch

from analysis.hybrid import round_kind
from engine import EngineState, HybridOptions, NGramOptions, Strategy, pair_of, run_strategy
from engine.drafters import DRAFTERS, model_drafter
from generation.drafter import Drafter
from generation.model_drafter import ModelDrafter
from ngram_assisted import HybridDrafter
from sampling import GreedyProcessor, MultinomialProcessor
from model_drafters.selfdraft.build import build_self_drafter
from model_drafters.selfdraft.drafter import SelfDrafter
from model_drafters.selfdraft.spec import parse_self_draft
from tests.helpers.distribution import BOUND, PROMPT as SAMPLING_PROMPT, STEPS, chi_square_excess, exact_distribution
from tests.helpers.inspection import check_rounds
from tests.helpers.models import tiny_llama

# The tail "8 5 17" occurred three times before: the storage matches at once, and again later.
PROMPT = [8, 5, 17, 33, 1, 8, 5, 17, 12, 2, 8, 5, 17, 33, 3, 8, 5, 17]
L = 2
LENGTH = 40


def perturbed(model, noise: float, seed: int):
    """A copy of ``model`` with every weight moved by ``noise`` times its spread: a drafter that
    agrees with the model often, not always (on this pair about one draft in six is accepted)."""
    other = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for weight in other.parameters():
            weight.add_(noise * weight.std() * torch.randn(weight.shape, generator=generator))
    return other


@pytest.fixture(scope="module")
def greedy_target():
    return tiny_llama(3, vocab_size=64, logit_scale=4.0)


@pytest.fixture(scope="module")
def greedy_drafter(greedy_target):
    return perturbed(greedy_target, 0.6, seed=7)


@pytest.fixture(scope="module")
def expected(greedy_target):
    return run_strategy(Strategy("target", processor=GreedyProcessor(), max_gen_len=LENGTH),
                        pair_of(greedy_target), PROMPT).tokens


def hybrid(target, drafter, prompt, *, processor, min_match: int = L, storage: str = "sam", tree: int = 0,
           gamma: int = 4, length: int = LENGTH, verify: str = "residual", tree_sample: bool = False,
           state: EngineState | None = None, generator=None, key: str = "model"):
    options = HybridOptions(min_match, NGramOptions(storage=storage, max_pattern=4, max_outputs=8))
    strategy = Strategy("speculative", drafter=key, drafter_options=options, gamma=gamma, processor=processor,
                        max_gen_len=length, tree=tree, tree_branch=2, tree_sample=tree_sample, verify=verify)
    return run_strategy(strategy, pair_of(target, drafter), prompt, state=state, generator=generator)


def kinds(result) -> list[str | None]:
    return [round_kind(r.note) for r in result.trace]


# ------------------------------------------------------------------ greedy: the target's own output

@pytest.mark.parametrize("tree", [0, 6], ids=["chain", "tree"])
@pytest.mark.parametrize("storage", ["sam", "suffix", "basic"])
def test_greedy_output_is_the_targets_with_both_kinds_of_rounds(greedy_target, greedy_drafter, expected,
                                                                storage, tree):
    result = hybrid(greedy_target, greedy_drafter, PROMPT, processor=GreedyProcessor(), storage=storage, tree=tree)
    assert result.tokens == expected
    assert result.tree_fallback == "" and result.tree_rule == ("top" if tree else "")
    by_kind = {kind: [r for r, k in zip(result.trace, kinds(result)) if k == kind] for kind in ("model", "retrieval")}
    for kind, rounds in by_kind.items():
        assert rounds, f"no {kind} round: the test would not judge the hybrid"
    model = by_kind["model"]
    assert sum(r.accepted for r in model) > 0 and any(r.accepted < len(r.drafted) for r in model)
    # Why each round drafted what it did: retrieval at a match of L or more, the model below it.
    sources = {"sam": {"context"}, "suffix": {"prompt", "global"}, "basic": {"context"}}[storage]
    assert all(r.note["source"] in sources and r.note["match"] >= L for r in by_kind["retrieval"])
    assert all(r.note["match"] < L for r in model)
    assert all((r.note is None) == (r.gamma == 0) for r in result.trace)
    counts = result.hybrid
    assert counts["L"] == L and counts["rounds"] == {k: len(v) for k, v in by_kind.items()}
    assert sum(counts["accepted"].values()) == result.accepted and sum(counts["drafted"].values()) == result.drafted


@pytest.mark.parametrize("verify", ["residual", "block", "strict"])
def test_every_verify_rule_keeps_the_greedy_output(greedy_target, greedy_drafter, expected, verify):
    result = hybrid(greedy_target, greedy_drafter, PROMPT, processor=GreedyProcessor(), verify=verify)
    assert result.tokens == expected and result.verify_rule == verify
    assert {"model", "retrieval"} <= set(kinds(result))


def test_l_zero_is_the_drafter_model_alone(greedy_target, greedy_drafter, expected):
    plain = run_strategy(Strategy("speculative", drafter="model", processor=GreedyProcessor(), max_gen_len=LENGTH),
                         pair_of(greedy_target, greedy_drafter), PROMPT)
    off = hybrid(greedy_target, greedy_drafter, PROMPT, processor=GreedyProcessor(), min_match=0)
    assert off.tokens == plain.tokens == expected
    assert [r.drafted for r in off.trace] == [r.drafted for r in plain.trace]
    assert off.hybrid == {} and all(r.note is None for r in off.trace)


@pytest.mark.parametrize("value", [-1, 65, True, 2.0])
def test_a_match_length_out_of_range_is_refused_in_one_line(value):
    with pytest.raises(ValueError, match="match length L"):
        HybridOptions(value)


# ------------------------------------------------------------------ the drafter model's cache

def round_drafters(result, drafter) -> list:
    """Per round, the drafter model when it drafted the round, None for retrieval (q one-hot)."""
    return [drafter if kind == "model" else None for kind in kinds(result)]


def stale_chances(result) -> int:
    """Model rounds that left a rejected draft in the drafter's cache (a rejection before the last
    draft), followed by a retrieval round and then another model round."""
    ks = kinds(result)
    chances = 0
    for i, (rnd, kind) in enumerate(zip(result.trace, ks)):
        if kind == "model" and rnd.accepted < len(rnd.drafted) - 1 and i + 1 < len(ks) and ks[i + 1] == "retrieval":
            chances += "model" in ks[i + 2:]
    return chances


def test_each_round_states_the_q_of_the_text_kept(greedy_target, greedy_drafter, expected):
    """Every recorded q (the drafter's softmax under greedy) equals the drafter model run uncached
    on the kept text, in every model round, also those after a retrieval round; retrieval
    rounds state one-hot q."""
    result = hybrid(greedy_target, greedy_drafter, PROMPT, processor=GreedyProcessor())
    assert result.tokens == expected
    assert stale_chances(result) > 0, "no retrieval round followed a rejection: nothing to catch up on"
    check_rounds(result, PROMPT, greedy_target, None, GreedyProcessor(),
                 drafters=round_drafters(result, greedy_drafter))
    # The catch-up is the next proposal's first forward: no forward beyond one per draft.
    model_drafts = sum(len(r.drafted) for r, k in zip(result.trace, kinds(result)) if k == "model")
    assert result.drafter_calls == model_drafts


def test_a_drafter_cache_not_cut_after_a_retrieval_round_is_caught(monkeypatch, greedy_target, greedy_drafter,
                                                                   expected):
    """Mutation: the drafter model ignores the rounds it did not draft, so its cache keeps a
    rejected draft of its own and its next proposal reads the wrong text."""
    monkeypatch.setattr(ModelDrafter, "update", Drafter.update)
    result = hybrid(greedy_target, greedy_drafter, PROMPT, processor=GreedyProcessor())
    assert result.tokens == expected                 # lossless all the same: only the drafts go wrong
    with pytest.raises(AssertionError):
        check_rounds(result, PROMPT, greedy_target, None, GreedyProcessor(),
                     drafters=round_drafters(result, greedy_drafter))


@pytest.mark.parametrize("spec", ["self:skip=1", "self:bf16"])
def test_a_self_drafter_drafts_beside_the_storage(greedy_target, expected, spec):
    """A drafter made from the target drafts on the target's cache: rounds it sat out leave it
    nothing to catch up on (its q on the kept text is checked where it computes in float32)."""
    drafter = build_self_drafter(greedy_target, parse_self_draft(spec))
    result = hybrid(greedy_target, drafter, PROMPT, processor=GreedyProcessor())
    assert result.tokens == expected and {"model", "retrieval"} <= set(kinds(result))
    if spec == "self:skip=1":
        check_rounds(result, PROMPT, greedy_target, None, GreedyProcessor(),
                     drafters=round_drafters(result, drafter))


def _own_cache_self_draft(monkeypatch, greedy_target):
    """A self-drafter kept on a cache of its own (as on a target whose cache it cannot share)."""
    monkeypatch.setattr(SelfDrafter, "_choose_mode", lambda self: "own")
    drafter = build_self_drafter(greedy_target, parse_self_draft("self:skip=1"))
    # γ 6: the drafter agrees often, so longer drafts are needed for a rejection before the last one
    return drafter, hybrid(greedy_target, drafter, PROMPT, processor=GreedyProcessor(), gamma=6)


def test_a_self_drafter_on_a_cache_of_its_own_catches_up(monkeypatch, greedy_target, expected):
    drafter, result = _own_cache_self_draft(monkeypatch, greedy_target)
    assert result.tokens == expected and stale_chances(result) > 0
    check_rounds(result, PROMPT, greedy_target, None, GreedyProcessor(), drafters=round_drafters(result, drafter))


def test_a_self_drafter_that_keeps_the_rounds_from_its_own_cache_is_caught(monkeypatch, greedy_target, expected):
    monkeypatch.setattr(SelfDrafter, "update", Drafter.update)
    drafter, result = _own_cache_self_draft(monkeypatch, greedy_target)
    assert result.tokens == expected
    with pytest.raises(AssertionError):
        check_rounds(result, PROMPT, greedy_target, None, GreedyProcessor(),
                     drafters=round_drafters(result, drafter))


@pytest.mark.parametrize("method", ["slem", "tli"])
def test_a_drafter_with_another_tokenizer_drafts_beside_the_storage(method):
    """The drafter model crosses tokenizers itself (``cross_tokenizer``); the storage drafts target ids."""
    from engine import CrossTokenizerOptions
    from tests.helpers.cross_pairs import (byte_bpe, make_pair, metaspace_bpe, tiny_models, whole_character_bias,
                                           with_bias)
    from utils.vocab import encode_prompt

    bpe, meta = byte_bpe(), metaspace_bpe()
    target, drafter = tiny_models(bpe, meta, target_seed=3, drafter_seed=4)
    with_bias(target, whole_character_bias(bpe, len(bpe)))
    pair = make_pair(target, drafter, bpe, meta)
    ids = encode_prompt(bpe, "Hello 日本 😀 Hello 日本 😀 Hello", chat=True)
    want = run_strategy(Strategy("target", processor=GreedyProcessor(), max_gen_len=24), pair, ids).tokens
    options = HybridOptions(L, NGramOptions(storage="sam"), CrossTokenizerOptions(method))
    result = run_strategy(Strategy("speculative", drafter="model", drafter_options=options, gamma=4,
                                   processor=GreedyProcessor(), max_gen_len=24), pair, ids)
    assert result.tokens == want and {"model", "retrieval"} <= set(kinds(result))
    assert result.cross_tokenizer["method"] == method


# ------------------------------------------------------------------ the storage sees every token

class _DraftingSideOnly(HybridDrafter):
    """A mutation: the round's tokens go only to the side that drafted it."""

    def update(self, new_tokens, top_k):
        side = self.model if self.drafted_by_model else self.retrieval
        side.update(new_tokens, top_k)
        self.notes.append(self._pending)
        self._pending = None


def _storage_text(state) -> list[int]:
    return list(state.hybrid_storage.context.text)


def test_the_storage_holds_every_token_whichever_side_drafted(greedy_target, greedy_drafter, expected):
    state = EngineState()
    result = hybrid(greedy_target, greedy_drafter, PROMPT, processor=GreedyProcessor(), state=state)
    assert {"model", "retrieval"} <= set(kinds(result))
    assert _storage_text(state) == PROMPT + expected
    assert state.storage is None                     # NASD's storage is another one, untouched


def test_a_storage_fed_only_by_its_own_rounds_is_caught(monkeypatch, greedy_target, greedy_drafter, expected):
    state = EngineState()
    result = hybrid(greedy_target, greedy_drafter, PROMPT, processor=GreedyProcessor(), state=state,
                    key=_mutant(monkeypatch, _DraftingSideOnly))
    assert result.tokens == expected
    assert _storage_text(state) != PROMPT + expected


# ------------------------------------------------------------------ sampling: the target's distribution

# Enough for power here: the mutation below lands hundreds of standard deviations off at 200 draws
# (chi-square excess above 600), the correct sampler within 1-3 at 200 to 600 draws.
SAMPLES = 200


def sampled(target, drafter, *, verify: str = "residual", tree: int = 0, key: str = "model",
            samples: int = SAMPLES):
    """Counts of the first STEPS tokens over ``samples`` runs from one generator, and the rounds
    of each kind, with the drafts each kind proposed and had accepted."""
    generator = torch.Generator().manual_seed(1234)
    counts: dict = {}
    tally = {kind: [0, 0, 0] for kind in ("model", "retrieval")}  # rounds, drafted, accepted
    with torch.inference_mode():
        for _ in range(samples):
            r = hybrid(target, drafter, SAMPLING_PROMPT, processor=MultinomialProcessor(1.0), min_match=3,
                       gamma=STEPS, length=STEPS, verify=verify, tree=tree, tree_sample=True,
                       generator=generator, key=key)
            counts[tuple(r.tokens)] = counts.get(tuple(r.tokens), 0) + 1
            for rnd, kind in zip(r.trace, kinds(r)):
                if kind is not None:
                    tally[kind][0] += 1
                    tally[kind][1] += len(rnd.drafted)
                    tally[kind][2] += rnd.accepted
    return counts, tally


@pytest.fixture(scope="module")
def exact(target):
    return exact_distribution(target, MultinomialProcessor(1.0))


@pytest.mark.parametrize("verify, tree", [("residual", 0), ("block", 0), ("residual", 4)],
                         ids=["residual", "block", "tree"])
def test_sampling_keeps_the_target_distribution(target, drafter, exact, verify, tree):
    counts, tally = sampled(target, drafter, verify=verify, tree=tree)
    for kind, (rounds, drafted, accepted) in tally.items():
        assert rounds > 0 and 0 < accepted < drafted, f"{kind} rounds: {tally[kind]}"   # both paths, both kinds
    assert chi_square_excess(counts, exact, SAMPLES) < BOUND


def test_sampled_trees_fall_back_to_top_children_trees(target, drafter):
    """A storage's tree has no q to draw its children from: the hybrid verifies top-children trees."""
    r = hybrid(target, drafter, SAMPLING_PROMPT, processor=MultinomialProcessor(1.0), min_match=3, tree=4,
               tree_sample=True, generator=torch.Generator().manual_seed(0), length=8)
    assert r.tree_rule == "top" and r.tree_fallback == ""


class _ModelQOnRetrieval(HybridDrafter):
    """A mutation: a retrieval draft stated with the drafter model's q along it (teacher-forced),
    as if the model had drawn it, instead of one-hot."""

    def propose(self, ids, k, stop_below=None):
        draft, q = super().propose(ids, k, stop_below)
        if q is not None or draft.numel() == 0:
            return draft, q
        model = self.model
        logits = model.model(torch.cat([ids, draft.view(1, -1)], dim=1)).logits[0, ids.shape[1] - 1:-1]
        return draft, model.processor(logits[:, :model.vocab_size])


def _mutant(monkeypatch, cls) -> str:
    """Register a drafter kind that builds the engine's hybrid as ``cls``; returns the kind."""
    def factory(pair, strategy, state, context):
        inner = model_drafter(pair, strategy, state, context)
        return cls(inner.model, inner.retrieval, inner.min_match)

    monkeypatch.setitem(DRAFTERS, "mutant", factory)
    return "mutant"


def test_a_retrieval_draft_stated_with_the_models_q_is_caught(monkeypatch, target, drafter, exact):
    counts, tally = sampled(target, drafter, key=_mutant(monkeypatch, _ModelQOnRetrieval))
    assert tally["retrieval"][0] > 0
    assert chi_square_excess(counts, exact, SAMPLES) >= BOUND


def inspected_runs(target, drafter, key: str = "model") -> list:
    """A few sampled runs of 12 tokens, each round's q and p recorded by the inspector."""
    return [hybrid(target, drafter, SAMPLING_PROMPT, processor=MultinomialProcessor(1.0), min_match=3, gamma=3,
                   length=12, generator=torch.Generator().manual_seed(seed), key=key) for seed in range(6)]


def test_under_sampling_each_round_states_the_q_it_drew_from(target, drafter):
    """Model rounds record the drafter's q on the kept text, retrieval rounds one-hot q, and each
    draft's acceptance is min(1, p/q) with that q (``tests.helpers.inspection``)."""
    seen = set()
    for r in inspected_runs(target, drafter):
        check_rounds(r, SAMPLING_PROMPT, target, None, MultinomialProcessor(1.0), drafters=round_drafters(r, drafter))
        seen |= set(kinds(r))
    assert {"model", "retrieval"} <= seen


def test_the_inspector_catches_the_models_q_on_a_retrieval_draft(monkeypatch, target, drafter):
    runs = inspected_runs(target, drafter, key=_mutant(monkeypatch, _ModelQOnRetrieval))
    with pytest.raises(AssertionError):
        for r in runs:
            check_rounds(r, SAMPLING_PROMPT, target, None, MultinomialProcessor(1.0),
                         drafters=round_drafters(r, drafter))
