"""Every strategy on every architecture family of the zoo (tests/helpers/arch_zoo.py).

Greedy: autoregressive (cache on and off), speculative decoding (the family's
drafter at several gammas, and the target drafting for itself) and NASD are
token-identical to transformers' own ``generate``, on prompts longer than the
sliding windows and for long enough to cross them again. Sampling: on one
sliding-window, one recurrent and one encoder-decoder family, the first two
tokens follow the target's exact top-k distribution.

An engine may refuse a model it cannot roll back (``UnsupportedCacheError``,
one line); only static caches may be refused, and none of these families has
one, so on transformers 5.x a refusal fails the test with its reason. On the
4.57 floor, recurrent and hybrid families keep their state in a cache class of
their own model (``MambaCache``, ...), which the engine refuses with the cache
on (docs/versions.md); that one refusal is expected there and nowhere else.

The block and strict rules and the model-free drafters (``arch_zoo.ANY_RELEASE_CHECKS``) are
marked ``any_release``: test.sh checks them on the newest transformers only.

Test ids are ``<family>-<check>``, e.g. ``mistral-speculative-g3``. This file checks every other
family (``arch_zoo.family_cases(0)``); tests/test_architectures_2.py the rest, so that the two
halves run on two cores.
"""

import pytest
import torch
import transformers

import generation.accept
import generation.verify
import generation.verify_rules
from tests.helpers import arch_zoo
from tests.helpers.arch_zoo import FAMILIES


@pytest.mark.parametrize("name, spec", arch_zoo.family_cases(0))
def test_family(name, spec):
    arch_zoo.family_test(name, spec)


def test_every_family_builds_or_names_its_missing_class():
    """A family is either built or skipped with the class this transformers lacks (or, on a release
    between the CI ends, with the error transformers' own forward of it raises)."""
    lacks = f"transformers {transformers.__version__} has no "
    for name in FAMILIES:
        try:
            model = arch_zoo.build(name)
        except arch_zoo.FamilyUnavailable as e:
            assert str(e).startswith(lacks) or (arch_zoo.BETWEEN_THE_ENDS and "'s own forward raises" in str(e)), e
            continue
        assert not model.training
        assert model.get_output_embeddings().weight is not model.get_input_embeddings().weight


def test_prompts_are_longer_than_every_window():
    windows = [f.window for f in FAMILIES.values() if f.window]
    assert windows and max(windows) < min(len(p) for p in arch_zoo.PROMPTS)
    assert max(windows) < arch_zoo.LENGTH
    assert max(windows) < len(arch_zoo.SAMPLING_BASE)


def test_a_wrong_token_is_reported_with_its_position():
    outcome = arch_zoo.compare([4, 5, 6], [4, 5, 7], "speculative")
    assert outcome.status == "fail"
    assert outcome.detail == "speculative: token 2 is 6, generate gave 7"
    assert arch_zoo.compare([4, 5], [4, 5, 7], "x").detail == "x: 2 tokens, generate gave 3"


def test_sampling_check_catches_resampling_from_p(monkeypatch):
    """The sampling check has the power to fail: with the classic mistake (on a
    rejection, draw from p instead of the residual) patched in, NASD's sampled
    tokens no longer follow the target (the sampling prompt makes NASD's first
    draft a top-k token, so rejections are frequent)."""
    monkeypatch.setattr(generation.accept, "residual_distributions", lambda p, q, draft: p)
    outcome = arch_zoo.guarded(lambda: arch_zoo.check_sampling("llama", "nasd"))
    assert outcome.status == "fail" and "chi-square" in outcome.detail, outcome


def test_greedy_check_catches_a_broken_accept_rule(monkeypatch):
    """With every draft accepted, the family drafter's wrong drafts reach the
    output, and the check names the first wrong token."""
    def accept_everything(p, q, draft, sample, generator=None):
        k = draft.shape[0]
        return p.new_tensor(k, dtype=torch.long), sample(p[k:], generator)[0]

    for name in generation.verify_rules.VERIFY_RULES:  # every chain rule, whichever one runs
        monkeypatch.setitem(generation.verify_rules.VERIFY_RULES, name, accept_everything)
    outcome = arch_zoo.guarded(lambda: arch_zoo.check_speculative("llama", "drafter", 3))
    assert outcome.status == "fail" and "generate gave" in outcome.detail, outcome


def test_the_zoo_argmax_is_decisive():
    """Wide initialisation: on every family the median gap between the top two logits
    of the target is above 1 (a wrong cached state then flips argmaxes), and the
    independent drafter disagrees with the target on most positions."""
    for name in FAMILIES:
        try:
            target, other = arch_zoo.build(name), arch_zoo.build(name, "independent")
        except arch_zoo.FamilyUnavailable:
            continue
        ids = torch.tensor([arch_zoo.PROMPTS[0]])
        with torch.inference_mode():
            kwargs = arch_zoo.inputs(name, ids)
            logits, others = target(**kwargs).logits[0], other(**kwargs).logits[0]
        top = logits.topk(2, dim=-1).values
        margin = float((top[:, 0] - top[:, 1]).median())
        assert margin > 1.0, f"{name}: median top-1/top-2 logit gap {margin:.2f}"
        agree = float((logits.argmax(-1) == others.argmax(-1)).float().mean())
        assert agree < 0.5, f"{name}: the independent drafter agrees with the target on {agree:.0%}"
