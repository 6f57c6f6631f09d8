"""``--drafter gemma4-assistant:PATH``: a Gemma 4 assistant drafting from the target's keys and values.

The target is a tiny random Gemma 4 text model (two sliding layers, window 6, and a full
one); the assistant a tiny random ``Gemma4AssistantForCausalLM`` (one sliding, one full
layer), both from configs with independent, wide weights (``tests.helpers.gemma4_assistant``),
so drafts are mostly rejected. The loading tests save both as a user's downloads are laid
out and load them back through ``engine.load_pair(TARGET_DIR, "gemma4-assistant:DIR")``.
Every drafted chain's logits are held against a recomputation from nothing (the target
uncached, then the assistant step by step); hidden states from the wrong position, or the
target's keys and values of the verify pass before its rollback, must fail that check.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import model_drafters.gemma4_assistant.kind
from checks.selftest import probe_check
from engine import Strategy, load_pair, pair_of, run_strategy
from model_drafters.gemma4_assistant import AssistantDrafter, AssistantRefused, mark_assistant
from model_drafters.gemma4_assistant.model import has_assistant_model
from repl.runner import Runner
from sampling import GreedyProcessor
from sampling.spec import ProcessorSpec
from tests.helpers.decode import autoregressive
from tests.helpers.models import tiny_llama
from tests.helpers.tokenizers import word_tokenizer
from tests.helpers.recording import record_chains
from utils.errors import ModelLoadError

HAS_ASSISTANT = has_assistant_model()

needs_assistant = pytest.mark.skipif(not HAS_ASSISTANT, reason="this transformers has no Gemma4AssistantForCausalLM "
                                                               "before 5.24 (refusal tested below)")
PROMPT = [1, 5, 3, 7, 2, 4]
VOCAB = 16          # small enough that some drafts are accepted
SEEDS = (1, 1)      # (target, assistant): 6 of 68 greedy drafts accepted at gamma 3, some rounds in part


@pytest.fixture
def recorded(monkeypatch):
    """Chains the engine's assistant drafter proposes during the test (looked up where the engine builds it)."""
    return record_chains(monkeypatch, "AssistantDrafter")


def speculative(pair, prompt, *, gamma, processor=None, max_gen_len=30, **options):
    strategy = Strategy("speculative", drafter="model", gamma=gamma, max_gen_len=max_gen_len,
                        processor=processor or GreedyProcessor(), **options)
    return run_strategy(strategy, pair, prompt)


def worst_logit_error(target, assistant, chains) -> float:
    """The largest |drafter logit - recomputed logit| over every chain, relative to the chain's largest logit."""
    from tests.helpers.gemma4_assistant import reference_logits

    assert chains
    worst = 0.0
    for committed, drafts, logits in chains:
        want = reference_logits(target, assistant, committed, drafts)
        worst = max(worst, ((logits - want).abs().max() / want.abs().max()).item())
    return worst


def small(vocab_size=VOCAB):
    """The target and its marked assistant, in memory, and their pair."""
    from tests.helpers.gemma4_assistant import tiny_assistant, tiny_target

    target = tiny_target(seed=SEEDS[0], vocab_size=vocab_size)
    assistant = mark_assistant(tiny_assistant(target, seed=SEEDS[1]), target)
    return target, assistant, pair_of(target, assistant)


# ------------------------------------------------------------------ loading through --drafter gemma4-assistant:PATH


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """(target dir, assistant dir): the tiny pair saved as a user's downloads are laid out."""
    if not HAS_ASSISTANT:
        pytest.skip("this transformers has no Gemma4AssistantForCausalLM")
    from tests.helpers.gemma4_assistant import save_pair, tiny_assistant, tiny_target

    target = tiny_target(seed=SEEDS[0], vocab_size=VOCAB)
    return save_pair(target, tiny_assistant(target, seed=SEEDS[1]), tmp_path_factory.mktemp("gemma4"))


def load_saved(saved):
    """The saved pair loaded as ``--target DIR --drafter gemma4-assistant:DIR`` loads it, without its
    end tokens (the word tokenizer's ``<|im_end|>`` comes early on this random target)."""
    target_dir, assistant_dir = saved
    pair = load_pair(str(target_dir), f"gemma4-assistant:{assistant_dir}", device="cpu", dtype="float32")
    assert pair.end_tokens
    return replace(pair, end_tokens=[])


@needs_assistant
def test_load_pair_reads_the_assistant_and_matches_target_ar_and_transformers_generate(saved, recorded):
    from bench.peers import generation_config, peer_call
    from bench.processors import ProcessorSpec as BenchSpec

    pair = load_saved(saved)
    assistant = pair.drafter
    assert type(assistant).__name__ == "Gemma4AssistantForCausalLM"
    assert "Gemma 4 assistant, 2 layers" in pair.drafter_name and "Gemma 4 assistant" in pair.probe.summary()
    want = autoregressive(PROMPT, pair.target, processor=GreedyProcessor(), max_gen_len=24).tokens
    config = generation_config(BenchSpec("greedy"), max_new_tokens=24, end_tokens=[VOCAB - 1], pad_token_id=0)
    with torch.inference_mode():
        plain = peer_call("hf_generate", pair.target, None, torch.tensor([PROMPT]), config)()[0, len(PROMPT):]
    assert plain.tolist() == want[:len(plain)]                      # transformers' generate stops at its end token
    for gamma in (1, 3):
        result = speculative(pair, PROMPT, gamma=gamma, max_gen_len=24)
        assert result.tokens == want, gamma
        assert result.drafted > result.accepted                     # rejections happened
    assert worst_logit_error(pair.target, assistant, recorded) < 1e-4
    assert probe_check(pair).passed                                 # the self-test's probe: recorded, not run
    Runner(pair).warm_up()                                          # the REPL's warm-up leaves drafter AR out


@needs_assistant
def test_transformers_assisted_generation_with_the_assistant_is_greedy_identical(saved):
    """transformers' own assisted generation with the assistant (``SinglePositionMultiTokenCandidateGenerator``:
    the benchmark's ``hf_assisted`` peer on this pair) against its plain greedy ``generate``."""
    from bench.peers import assistant_settings, generation_config, peer_call
    from bench.processors import ProcessorSpec as BenchSpec

    pair = load_saved(saved)
    config = generation_config(BenchSpec("greedy"), max_new_tokens=24, end_tokens=[VOCAB - 1], pad_token_id=0)
    ids = torch.tensor([PROMPT])
    with torch.inference_mode():
        plain = peer_call("hf_generate", pair.target, None, ids, config)()[0].tolist()
        for gamma in (1, 3):
            with assistant_settings(pair.drafter, gamma, 0.0):
                assisted = peer_call("hf_assisted", pair.target, pair.drafter, ids, config)()[0].tolist()
            assert assisted == plain, gamma


def test_an_assistant_marked_on_a_release_it_does_not_run_is_refused_in_one_line(monkeypatch):
    """Built by hand (``mark_assistant``) where the assistant is 5.17's earlier one: refused at the
    marking, not a KeyError in the first draft. Mutation: without the check this fails."""
    import model_drafters.gemma4_assistant.model

    monkeypatch.setattr(model_drafters.gemma4_assistant.model, "has_assistant_model", lambda: False)
    with pytest.raises(AssistantRefused, match="needs a transformers with") as info:
        mark_assistant(torch.nn.Linear(2, 2), tiny_llama(0))
    assert "\n" not in str(info.value)


def test_a_target_that_is_not_gemma4_is_refused_in_one_line(tmp_path):
    """A Llama target; on a transformers without the assistant class, that is said first."""
    tiny_llama(0, vocab_size=64).save_pretrained(tmp_path / "llama")
    word_tokenizer(words=[f"w{i}" for i in range(59)]).save_pretrained(tmp_path / "llama")
    with pytest.raises(ModelLoadError) as info:
        load_pair(str(tmp_path / "llama"), f"gemma4-assistant:{tmp_path / 'none'}", device="cpu")
    message = str(info.value)
    assert "\n" not in message and message.startswith("--drafter gemma4-assistant:")
    if HAS_ASSISTANT:
        assert "Gemma 4 target only (this target is llama)" in message
    else:
        assert "needs a transformers with Gemma4AssistantForCausalLM" in message


@needs_assistant
def test_a_path_without_an_assistant_and_mismatched_sizes_are_refused_in_one_line(saved, tmp_path):
    from tests.helpers.gemma4_assistant import tiny_assistant, tiny_target

    target_dir, _ = saved
    wrong = tiny_assistant(tiny_target(vocab_size=VOCAB), backbone=48)          # reads 48-wide hidden states
    wrong.save_pretrained(tmp_path / "wide")
    heads = tiny_assistant(tiny_target(vocab_size=VOCAB), head_dim=8)          # keys of another head size
    heads.save_pretrained(tmp_path / "heads")
    cases = {str(tmp_path / "missing"): "missing: no such directory",
             str(target_dir): "is not a Gemma 4 assistant (its config's model_type is 'gemma4_text'",
             str(tmp_path / "wide"): "reads hidden states of width 48, the target's are 32 wide",
             str(tmp_path / "heads"): "read 2 key/value heads of 8, the target's have 2 of 16"}
    for path, said in cases.items():
        with pytest.raises(ModelLoadError) as info:
            load_pair(str(target_dir), f"gemma4-assistant:{path}", device="cpu")
        message = str(info.value)
        assert "\n" not in message and said in message, message
    with pytest.raises(ModelLoadError, match="needs the directory"):
        load_pair(str(target_dir), "gemma4-assistant:", device="cpu")


@needs_assistant
def test_an_assistant_for_another_vocabulary_is_refused():
    from tests.helpers.gemma4_assistant import tiny_assistant, tiny_target

    with pytest.raises(AssistantRefused, match="vocabulary has 16 entries, the target's 32"):
        mark_assistant(tiny_assistant(tiny_target(vocab_size=16)), tiny_target(vocab_size=32))


# ------------------------------------------------------------------ drafting (in memory)


@needs_assistant
def test_greedy_chains_of_any_gamma_equal_target_ar_and_the_logits_are_exact(recorded):
    target, assistant, pair = small()
    want = autoregressive(PROMPT, target, processor=GreedyProcessor(), max_gen_len=30).tokens
    partial = 0
    for gamma in (1, 2, 3, 5):
        result = speculative(pair, PROMPT, gamma=gamma)
        assert result.tokens == want, gamma
        assert result.drafted > result.accepted > 0
        partial += sum(1 for r in result.trace if 0 < r.accepted < len(r.drafted))
        assert result.drafter_calls == result.drafted                # one assistant forward per draft
    assert partial > 0                                               # rounds that kept part of a chain
    assert len(PROMPT) + 30 > 2 * 6                                  # past the sliding window: its keys are cut
    assert worst_logit_error(target, assistant, recorded) < 1e-4


@needs_assistant
def test_mutation_hidden_state_of_the_wrong_position_fails_the_logits_check(monkeypatch, recorded):
    """The last row the verify kept (a rejected draft's, in a round that rejected) in place of
    the row of the last committed position."""
    monkeypatch.setattr(AssistantDrafter, "last_hidden", lambda self, position: self.target.hidden[1][-1][None, None])
    target, assistant, pair = small()
    speculative(pair, PROMPT, gamma=3)
    assert worst_logit_error(target, assistant, recorded) > 1e-2


@needs_assistant
def test_mutation_keys_of_the_verify_before_its_rollback_fail_the_logits_check(monkeypatch, recorded):
    """The target's keys and values as the verify pass left them, cut to the committed length
    plus one as transformers' own loop cuts them: after a rejection they hold the rejected
    draft's key at the position being drafted from."""
    import model_drafters.gemma4_assistant.drafter as drafter_module
    import kvcache.cache

    stale = {}
    forward = kvcache.cache.CachedModel.forward

    def keeping(self, ids, keep):
        logits = forward(self, ids, keep)
        if self.cache is not None:
            stale["layers"] = [(layer.keys.clone(), layer.values.clone(), getattr(layer, "sliding_window", None))
                               for layer in self.cache.layers]
        return logits

    def unrolled(cache, producers, seen):
        states = {}
        for kind, index in producers.items():
            keys, values, window = stale["layers"][index]
            if window is None:
                keys, values = keys[:, :, :seen + 1], values[:, :, :seen + 1]
            states[kind] = (keys, values)
        return states

    monkeypatch.setattr(kvcache.cache.CachedModel, "forward", keeping)
    monkeypatch.setattr(drafter_module, "shared_kv_states", unrolled)
    target, assistant, pair = small()
    speculative(pair, PROMPT, gamma=3)
    assert worst_logit_error(target, assistant, recorded) > 1e-2


@needs_assistant
def test_no_target_forward_is_added_with_the_cache_on_or_off(recorded):
    """One target forward per round, plus the prompt's prefill in the first; with the cache off the
    keys come from the uncached verify's ``shared_kv_states`` and must match as well."""
    target, assistant, pair = small()
    want = autoregressive(PROMPT, target, processor=GreedyProcessor(), max_gen_len=20).tokens
    for use_cache in (True, False):
        result = speculative(pair, PROMPT, gamma=3, max_gen_len=20, use_cache=use_cache)
        assert result.tokens == want and result.drafted > result.accepted
        assert result.target_calls == len(result.trace) + 1, use_cache
    assert worst_logit_error(target, assistant, recorded) < 1e-4


@needs_assistant
def test_trees_fall_back_to_chains_and_the_assistant_cannot_decode_alone():
    target, _, pair = small()
    want = autoregressive(PROMPT, target, processor=GreedyProcessor(), max_gen_len=12).tokens
    tree = speculative(pair, PROMPT, gamma=3, max_gen_len=12, tree=8)
    assert tree.tokens == want and "chains only" in tree.tree_fallback
    with pytest.raises(ValueError, match="cannot decode on its own"):
        run_strategy(Strategy("drafter", model="drafter", max_gen_len=4, processor=GreedyProcessor()), pair, PROMPT)


# ------------------------------------------------------------------ sampling


def sampled_excess(samples: int) -> float:
    """Chi-square excess of the first three tokens under top-k 5 sampling (vocabulary 8), ``samples`` draws."""
    from tests.helpers.distribution import PROMPT as DIST_PROMPT, STEPS, chi_square_excess, exact_distribution, \
        sample_counts

    target, _, pair = small(vocab_size=8)
    spec = ProcessorSpec("topk", 1.0, top_k=5)
    exact = exact_distribution(target, spec.build())
    strategy = Strategy("speculative", drafter="model", gamma=3, max_gen_len=STEPS, processor=spec, inspect=False)
    counts = sample_counts(lambda generator: run_strategy(strategy, pair, DIST_PROMPT, generator=generator), samples)
    return chi_square_excess(counts, exact, sum(counts.values()))


@needs_assistant
def test_sampling_keeps_the_target_distribution():
    """600 draws (not the usual 2000: each draw runs the target and up to three assistant steps). Measured:
    the correct rule sits at 0.9 standard deviations, a resample from p instead of the residual at 23."""
    from tests.helpers.distribution import BOUND

    assert sampled_excess(600) < BOUND


@needs_assistant
def test_mutation_q_of_another_draft_fails_the_sampling_check(monkeypatch):
    """Each draft reported with the q of the draft before it (the first with the last's): 200 draws suffice
    (measured: 139 standard deviations)."""
    from tests.helpers.distribution import BOUND

    class Shifted(AssistantDrafter):
        def propose(self, ids, k, stop_below=None):
            drafts, q = super().propose(ids, k, stop_below)
            return drafts, (torch.roll(q, 1, dims=0) if q is not None else q)

    monkeypatch.setattr(model_drafters.gemma4_assistant.kind, "AssistantDrafter", Shifted)
    assert sampled_excess(200) > BOUND
