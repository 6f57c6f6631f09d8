"""Greedy losslessness on the real SmolLM2-135M-Instruct (the offline default):
speculative == NASD == autoregressive == transformers' generate, token for token."""

import pytest
import torch

from engine import NGramOptions, Strategy, run_strategy
from generation import first_divergence
from sampling import GreedyProcessor
from tests.helpers.devices import process_cores

pytestmark = pytest.mark.slow

LENGTH = 48
GREEDY = GreedyProcessor()
TEXT = ("Passage: The Amazon rainforest covers much of the Amazon basin of South America. "
        "The basin encompasses seven million square kilometers, of which five and a half "
        "million square kilometers are covered by the rainforest. "
        "Question: how many square kilometers does the basin encompass? Quote the passage.")


@pytest.fixture(scope="module")
def pair():
    from engine import load_pair  # the front ends' loader: the default pair's drafter is measured
    from tests.helpers.pairs import few_self_drafters

    with pytest.MonkeyPatch.context() as patch:
        few_self_drafters(patch)
        return load_pair()


@pytest.fixture(scope="module")
def prompt(pair):
    from utils.vocab import encode_prompt  # the REPL's encoding: a flat id list on 4.x and 5.x
    return encode_prompt(pair.tokenizer, TEXT)


@pytest.fixture(scope="module")
def reference(pair, prompt):
    with process_cores(), torch.inference_mode():
        out = pair.target.generate(
            torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=LENGTH, do_sample=False, eos_token_id=pair.end_tokens,
            pad_token_id=pair.tokenizer.pad_token_id or 0)
    return out[0, len(prompt):].tolist()


def generate(pair, prompt, key, drafter=None, **options):
    """Greedy decoding of ``prompt`` on the loaded ``pair`` through the engine, as the REPL runs it."""
    strategy = Strategy(key, drafter=drafter, processor=GREEDY, max_gen_len=LENGTH, **options)
    with torch.inference_mode():
        return run_strategy(strategy, pair, prompt)


@pytest.mark.parametrize("use_cache", [True, False])
def test_autoregressive_matches_generate(process_cores, pair, prompt, reference, use_cache):
    got = generate(pair, prompt, "target", use_cache=use_cache)
    assert got.tokens == reference, f"diverges at {first_divergence(got.tokens, reference)}"


@pytest.mark.parametrize("gamma", [1, 3, 8])
def test_speculative_matches_generate(process_cores, pair, prompt, reference, gamma):
    got = generate(pair, prompt, "speculative", "model", gamma=gamma)
    assert got.tokens == reference, f"diverges at {first_divergence(got.tokens, reference)}"
    assert got.accepted > 0


# Both storages at the shortest and the longest n; test_equivalence.py sweeps n 2-5 on each storage,
# cache on and off, on a tiny model.
@pytest.mark.parametrize("storage, n", [("basic", 2), ("onelevel", 2), ("basic", 5), ("onelevel", 5)])
def test_nasd_matches_generate(process_cores, pair, prompt, reference, storage, n):
    got = generate(pair, prompt, "ngram", "ngram", gamma=4,
                   drafter_options=NGramOptions(storage=storage, n=n, top_k_filler=3))
    assert got.tokens == reference, f"diverges at {first_divergence(got.tokens, reference)}"


def test_nasd_without_cache_matches_generate(process_cores, pair, prompt, reference):
    got = generate(pair, prompt, "ngram", "ngram", gamma=6, use_cache=False,
                   drafter_options=NGramOptions(storage="basic", n=3, top_k_filler=1))
    assert got.tokens == reference
    assert got.tokens_per_target_call > 1.0     # the copy-heavy answer is drafted well
