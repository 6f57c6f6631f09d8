"""The model-free match storages: SuffixDecoding's tries (``suffix``) and the suffix automaton (``sam``).

The structures are checked on hand-made and random token sequences against brute
force (longest match, counts, the global trie's bound and order); decoding through
the engine's one way in is checked against target AR under greedy (chains and trees,
drafts accepted and rejected) and against the exact target distribution under
sampling (chi-square), each beside a mutation that must make it fail.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import replace

import pytest
import torch

import generation.accept
from checks.stats import goodness_of_fit
from engine import EngineState, NGramOptions, Strategy, pair_of, run_strategy
from engine.drafters import DRAFTERS, ngram_drafter
from ngram_assisted import MatchDrafter, SAMStorage, SuffixAutomaton, SuffixStorage, SuffixTrie
from ngram_assisted.sam import corpus_automaton, read_corpus
from sampling import GreedyProcessor, MultinomialProcessor
from tests.helpers.distribution import P_FLOOR, PROMPT as SAMPLING_PROMPT, STEPS, V, exact, target  # noqa: F401 (fixtures)
from tests.helpers.models import tiny_llama


# ------------------------------------------------------------------ brute force

def occurs_before(seq: list[int], pattern: list[int]) -> bool:
    """Whether ``pattern`` occurs in ``seq`` ending before its last position (so a token followed it)."""
    m = len(pattern)
    return any(seq[start:start + m] == pattern for start in range(len(seq) - m))


def brute_longest_match(seq: list[int], max_len: int) -> int:
    """The longest suffix of ``seq`` (at most ``max_len``) that occurred earlier, followed by a token."""
    best = 0
    for m in range(1, min(max_len, len(seq) - 1) + 1):
        if occurs_before(seq, seq[len(seq) - m:]):
            best = m
    return best


def brute_longest_in(corpus: list[int], seq: list[int]) -> int:
    """The longest suffix of ``seq`` that occurs anywhere in ``corpus``."""
    best = 0
    for m in range(1, len(seq) + 1):
        tail = seq[len(seq) - m:]
        if any(corpus[s:s + m] == tail for s in range(len(corpus) - m + 1)):
            best = m
    return best


def dump(trie: SuffixTrie) -> dict[tuple[int, ...], int]:
    """Every stored substring and its count."""
    out, stack = {}, [((), trie.root)]
    while stack:
        path, node = stack.pop()
        for token, child in (node.children or {}).items():
            out[path + (token,)] = child.count
            stack.append((path + (token,), child))
    return out


def brute_counts(sequences: list[list[int]], depth: int) -> dict[tuple[int, ...], int]:
    counts: dict[tuple[int, ...], int] = {}
    for seq in sequences:
        for i in range(len(seq)):
            for j in range(i + 1, min(len(seq), i + depth) + 1):
                counts[tuple(seq[i:j])] = counts.get(tuple(seq[i:j]), 0) + 1
    return counts


# ------------------------------------------------------------------ the suffix trie

def test_trie_counts_every_substring_up_to_its_depth():
    trie = SuffixTrie(3)
    trie.add([1, 2, 1, 2, 3])
    assert trie.find([1, 2]).count == 2 and trie.find([2, 1]).count == 1 and trie.find([1, 2, 3]).count == 1
    assert trie.find([1, 2, 1, 2]) is None          # 4 tokens: deeper than the trie
    assert dump(trie) == brute_counts([[1, 2, 1, 2, 3]], 3)


def test_streamed_and_whole_sequences_count_alike_and_removal_undoes_adding():
    rng = random.Random(0)
    seqs = [[rng.randrange(3) for _ in range(rng.randrange(1, 25))] for _ in range(6)]
    streamed = SuffixTrie(4)
    for seq in seqs:
        streamed.start()
        for token in seq:
            streamed.append(token)
    whole = SuffixTrie(4)
    for seq in seqs:
        whole.add(seq)
    assert dump(streamed) == dump(whole) == brute_counts(seqs, 4)
    for seq in seqs[:3]:
        whole.remove(seq)
    assert dump(whole) == brute_counts(seqs[3:], 4)    # nothing left over, no zero counts


def test_the_longest_match_equals_brute_force_on_random_sequences():
    rng = random.Random(1)
    for trial in range(300):
        seq = [rng.randrange(rng.choice((2, 3, 5))) for _ in range(rng.randrange(1, 40))]
        max_pattern = rng.randrange(1, 7)
        storage = SuffixStorage(8, max_pattern=max_pattern)
        storage.initialize(seq)
        match, node = storage.local.longest_match(storage.sequence, max_pattern)
        assert match == brute_longest_match(seq, max_pattern), (seq, max_pattern)


def test_the_chain_follows_the_most_frequent_continuation_and_the_tree_ranks_by_count():
    storage = SuffixStorage(16, max_pattern=4)
    storage.initialize([1, 2, 3, 9, 1, 2, 3, 9, 1, 2, 4, 1, 2])   # "1 2" -> 3 twice, 4 once
    chain = storage.draft(8, 1.0)
    assert (chain.source, chain.match) == ("prompt", 2)             # "4 1 2" never occurred before
    assert chain.tree.tokens == (3,) + (9,)                         # at most 1.0 x 2 tokens
    assert storage.draft(8, 0.5).tree.tokens == (3,)                # floor(0.5 x 2) = 1
    tree = storage.draft(3, 1.0, nodes=6, branch=2).tree
    # Best first by path probability: 3 (2/3), then 9 below it (2/3 x 1), then 4 (1/3), then 1
    # below 4 (1/3 x 1); two levels (1.0 x a match of 2).
    assert (tree.tokens, tree.parents, tree.ranks) == ((3, 9, 4, 1), (-1, 0, -1, 2), (0, 0, 1, 0))
    assert storage.draft(3, 1.0, nodes=3, branch=2).tree.tokens == (3, 9, 4)   # the node budget


def test_the_global_trie_keeps_earlier_outputs_bounded_oldest_out_first():
    storage = SuffixStorage(40, max_pattern=3, max_outputs=2)
    outputs = [[10, 11, 12], [20, 21, 22], [30, 31, 32]]
    for i, output in enumerate(outputs):
        storage.initialize([1, 2, 3])
        storage.extend(output)
        if i == 0:
            storage.initialize([7, 10, 11])         # the first output drafts for a new prompt
            draft = storage.draft(4, 1.0)
            assert (draft.source, draft.match, draft.tree.tokens) == ("global", 2, (12,))
            storage.extend([12])                    # this run's output: [12]
    storage.initialize([5])
    # Retired in order: outputs[0], (12,), outputs[1], outputs[2]; only the last two stay.
    assert list(storage.outputs) == [tuple(outputs[1]), tuple(outputs[2])]
    kept = [list(o) for o in storage.outputs]
    assert dump(storage.global_trie) == brute_counts(kept, storage.depth)
    assert storage.global_trie.find([10, 11]) is None            # the oldest output left
    storage.reset()
    assert not storage.outputs and len(storage.global_trie) == 0


def test_no_global_trie_when_m_is_zero():
    storage = SuffixStorage(32, max_pattern=3, max_outputs=0)
    storage.initialize([1])
    storage.extend([4, 5, 6])
    storage.initialize([4, 5])
    assert len(storage.global_trie) == 0 and storage.draft(4, 1.0).source == ""


# ------------------------------------------------------------------ the suffix automaton

def test_the_automaton_finds_the_brute_force_longest_match_after_every_token():
    rng = random.Random(2)
    for trial in range(200):
        alphabet = rng.choice((2, 3, 4))
        seq = [rng.randrange(alphabet) for _ in range(rng.randrange(1, 60))]
        sam = SuffixAutomaton()
        for i, token in enumerate(seq):
            match, end = sam.append(token)
            prefix = seq[:i + 1]
            assert match == brute_longest_match(prefix, len(prefix)), (prefix, match)
            if match:   # a genuine earlier occurrence: it ends before i, so a token followed it
                assert end < i and prefix[end - match + 1:end + 1] == prefix[i + 1 - match:]


def test_the_automaton_drafts_what_followed_the_most_recent_occurrence():
    storage = SAMStorage(16)
    storage.initialize([1, 2, 3, 9, 1, 2, 4, 8, 1, 2])
    draft = storage.draft(8, 1.0)
    assert (draft.source, draft.match, draft.tree.tokens) == ("context", 2, (4, 8))
    assert storage.draft(8, 3.0).tree.tokens == (4, 8, 1, 2)


def test_the_corpus_cursor_finds_the_longest_match_in_the_corpus():
    rng = random.Random(3)
    for trial in range(60):
        corpus = [rng.randrange(3) for _ in range(rng.randrange(1, 50))]
        automaton = corpus_automaton(corpus)
        storage = SAMStorage(8, corpus=automaton)
        seq = [rng.randrange(3) for _ in range(rng.randrange(1, 20))]
        storage.initialize(seq)
        assert storage.cursor.length == brute_longest_in(corpus, seq)
        draft = storage.draft(8, 2.0)
        if draft.source == "corpus":                 # the continuation follows a real occurrence
            m, tokens = draft.match, list(draft.tree.tokens)
            starts = [s for s in range(len(corpus) - m) if corpus[s:s + m] == seq[-m:]]
            assert any(corpus[s + m:s + m + len(tokens)] == tokens for s in starts)


def test_a_corpus_outside_the_vocabulary_is_refused():
    with pytest.raises(ValueError, match="outside the vocabulary"):
        SAMStorage(4, corpus=corpus_automaton([1, 2, 9]))


# ------------------------------------------------------------------ greedy: the target's own output

V_GREEDY = 64
# The longest match of the tail, "8 5 17", went on as "33" twice and "12" once: the first tree branches.
PROMPT = [8, 5, 17, 33, 1, 8, 5, 17, 12, 2, 8, 5, 17, 33, 3, 8, 5, 17]


@pytest.fixture(scope="module")
def greedy_target():
    return tiny_llama(3, vocab_size=V_GREEDY, logit_scale=4.0)


def ngram_run(storage: str, target, prompt, *, processor, tree: int = 0, length: int = 40, gamma: int = 4,
              state: EngineState | None = None, reset: bool = True, generator=None, key: str = "ngram",
              observer=None):
    options = NGramOptions(storage=storage, max_pattern=4, max_outputs=8, factor=1.0, reset=reset)
    strategy = Strategy(key, drafter=key, drafter_options=options, gamma=gamma,
                        processor=processor, max_gen_len=length, tree=tree, tree_branch=2)
    return run_strategy(strategy, pair_of(target), prompt, state=state, generator=generator, observer=observer)


@pytest.mark.parametrize("tree", [0, 6], ids=["chain", "tree"])
@pytest.mark.parametrize("storage", ["suffix", "sam"])
def test_greedy_output_is_the_targets_with_drafts_accepted_and_rejected(greedy_target, storage, tree):
    expected = run_strategy(Strategy("target", processor=GreedyProcessor(), max_gen_len=40),
                            pair_of(greedy_target), PROMPT).tokens
    result = ngram_run(storage, greedy_target, PROMPT, processor=GreedyProcessor(), tree=tree)
    assert result.tokens == expected
    assert 0 < result.accepted < result.drafted                    # both paths ran
    assert any(r.accepted < len(r.drafted) for r in result.trace)
    if tree and storage == "suffix":                              # a real tree: some node has two children
        assert any(len(r.tree_parents) > len(set(r.tree_parents)) for r in result.trace)
    # Every round that asked for drafts says why; one that asked for none (the budget's last token) says nothing.
    assert all((r.note is None) == (r.gamma == 0) for r in result.trace)
    notes = [r.note or {"source": "", "match": 0} for r in result.trace]
    sources = {"suffix": {"prompt", "global", ""}, "sam": {"context", ""}}[storage]
    assert {n["source"] for n in notes} <= sources
    assert any(n["match"] > 0 and len(r.drafted) > 0 for n, r in zip(notes, result.trace))
    json.dumps(result.to_dict(with_trace=True))                   # the note travels in a trace


def test_the_global_trie_drafts_across_prompts_only_without_reset(greedy_target):
    state = EngineState()
    first = ngram_run("suffix", greedy_target, PROMPT, processor=GreedyProcessor(), state=state, reset=False)
    follow_up = PROMPT + first.tokens[:3]          # the first output is what comes next; only the global trie has it
    expected = run_strategy(Strategy("target", processor=GreedyProcessor(), max_gen_len=40),
                            pair_of(greedy_target), follow_up).tokens
    kept = ngram_run("suffix", greedy_target, follow_up, processor=GreedyProcessor(), state=state, reset=False)
    assert kept.tokens == expected
    assert kept.trace[0].note["source"] == "global" and kept.trace[0].accepted > 0
    assert list(state.storage.outputs) == [tuple(first.tokens)]
    fresh = ngram_run("suffix", greedy_target, follow_up, processor=GreedyProcessor(), state=state, reset=True)
    assert fresh.tokens == expected and not state.storage.outputs
    assert fresh.trace[0].note["source"] != "global"


# ------------------------------------------------------------------ say why: sources, draft lengths, the model

class IdTokenizer:
    def decode(self, ids, skip_special_tokens=False):
        return "".join(f" t{i}" for i in ids)


def test_the_json_and_stats_numbers_are_the_rounds_own_counts(greedy_target):
    """One run through the engine (the second prompt of a session: both tries draft); every number
    the JSON gives for the sources, the draft lengths and the model is recounted from the rounds,
    in tokens. The live view's status line follows the same rounds."""
    from analysis.speedup import RoundMix, ar_step_from_result, costs_from_result, mix_speedup
    from repl.live import LiveView
    from repl.runs import PromptRun, StrategyRun
    from repl.settings import Settings
    from repl.stats_view import stats_view
    from tests.helpers.repl import console

    state = EngineState()
    first = ngram_run("suffix", greedy_target, PROMPT, processor=GreedyProcessor(), state=state, reset=False)
    prompt = PROMPT + first.tokens[:3]
    view = LiveView("ngram", IdTokenizer(), prompt)
    result = ngram_run("suffix", greedy_target, prompt, processor=GreedyProcessor(), state=state, reset=False,
                       observer=view)
    ar = run_strategy(Strategy("target", processor=GreedyProcessor(), max_gen_len=40), pair_of(greedy_target),
                      prompt)
    pr = PromptRun("p", prompt, greedy=True, settings=Settings(gamma=4, ngram_storage="suffix").to_dict(),
                   runs=[StrategyRun("ngram", result), StrategyRun("target", ar)])
    entry = json.loads(json.dumps(pr.to_dict()))["strategies"]["ngram"]
    trace = result.trace

    noted = [r for r in trace if r.note is not None]
    sources = {r.note["source"] or "none" for r in noted}
    assert "global" in sources and len(sources) >= 2 and set(entry["draft_sources"]) == sources
    for source, numbers in entry["draft_sources"].items():
        rounds = [r for r in noted if (r.note["source"] or "none") == source]
        assert numbers["rounds"] == len(rounds)
        assert numbers["drafted"] == sum(len(r.drafted) for r in rounds)
        assert numbers["accepted"] == sum(r.accepted for r in rounds)
        assert numbers["mean_match_length"] == pytest.approx(sum(r.note["match"] for r in rounds) / len(rounds))
    assert sum(n["drafted"] for n in entry["draft_sources"].values()) == result.drafted == entry["drafted"]
    assert sum(n["accepted"] for n in entry["draft_sources"].values()) == result.accepted == entry["accepted"]
    matched = [r.note["match"] for r in noted if r.note["source"]]
    assert entry["mean_match_length"] == pytest.approx(sum(matched) / len(matched))
    lengths = {int(k): c for k, c in entry["draft_lengths"]["rounds_by_length"].items()}
    assert lengths == dict(sorted(Counter(len(r.drafted) for r in trace).items())) and len(lengths) >= 3
    assert sum(k * c for k, c in lengths.items()) == result.drafted and sum(lengths.values()) == len(trace)
    # tokens, not characters: each round's accepted drafts and the target's token add up to the output
    yields = [r.accepted + (r.token is not None) for r in trace]
    assert sum(yields) == len(result.tokens) == entry["tokens"] == len(entry["token_ids"])

    # The model prices the measured lengths: shares and yields recounted from the rounds.
    assert entry["prediction_draft_lengths"] == "measured"
    shares = {k: c / len(trace) for k, c in lengths.items()}
    tokens = {k: sum(y for r, y in zip(trace, yields) if len(r.drafted) == k) / c for k, c in lengths.items()}
    costs = costs_from_result(result, ar_step_s=ar_step_from_result(ar))
    assert entry["predicted_speedup_steady"] == pytest.approx(mix_speedup(RoundMix(shares, tokens), costs))
    c, out = console()
    c.print(stats_view(pr))
    assert "at measured draft lengths" in out.getvalue() and "where the drafts came from" in out.getvalue()

    # The live status line saw the same rounds.
    assert (view.rounds, view.tokens) == (len(trace), len(result.tokens))
    assert (view.drafted_total, view.accepted_total) == (result.drafted, result.accepted)
    assert f"({result.accepted}/{result.drafted})" in view.status()


# ------------------------------------------------------------------ sampling: the target's distribution

SAMPLES = 600
MUTATION_SAMPLES = 1200   # the fresh-resample mutation's bias is small here: twice the samples (p ~ 1e-5 at 600)


def sampled(target, storage: str, *, tree: int = 0, key: str = "ngram", samples: int = SAMPLES):
    """Counts of the first STEPS tokens over ``samples`` runs (the suffix storage keeps its global
    trie from run to run), and the drafts proposed and accepted."""
    generator = torch.Generator().manual_seed(1234)
    state, counts, drafted, accepted = EngineState(), {}, 0, 0
    with torch.inference_mode():
        for _ in range(samples):
            r = ngram_run(storage, target, SAMPLING_PROMPT, processor=MultinomialProcessor(1.0), tree=tree,
                          length=STEPS, gamma=STEPS, state=state, reset=False, generator=generator, key=key)
            counts[tuple(r.tokens)] = counts.get(tuple(r.tokens), 0) + 1
            drafted, accepted = drafted + r.drafted, accepted + r.accepted
    return counts, drafted, accepted


@pytest.mark.parametrize("storage, tree", [("suffix", 0), ("suffix", 4), ("sam", 0)],
                         ids=["suffix-chain", "suffix-tree", "sam-chain"])
def test_sampling_keeps_the_target_distribution(target, exact, storage, tree):
    counts, drafted, accepted = sampled(target, storage, tree=tree)
    assert 0 < accepted < drafted                                 # the accept and the resample paths ran
    fit = goodness_of_fit(counts, exact)
    assert fit.p_value > P_FLOOR, fit.describe()


def test_a_fresh_resample_on_a_mismatch_is_caught(monkeypatch, target, exact):
    """The classic NASD mistake: draw from p instead of the residual after a rejected draft."""
    monkeypatch.setattr(generation.accept, "residual_distributions", lambda p, q, draft: p)
    counts, _, _ = sampled(target, "suffix", samples=MUTATION_SAMPLES)
    assert goodness_of_fit(counts, exact).p_value < P_FLOOR


class _Uniform(MatchDrafter):
    """A mutation: the storage's deterministic drafts, claimed to come from a uniform q."""

    def propose(self, ids, k, stop_below=None):
        draft, _ = super().propose(ids, k, stop_below)
        return draft, torch.full((draft.shape[0], V), 1.0 / V)


def test_a_drafter_that_misstates_q_is_caught(monkeypatch, target, exact):
    def factory(pair, strategy, state, context):
        inner = ngram_drafter(pair, strategy, state, context)
        return _Uniform(inner.storage, factor=inner.factor)

    monkeypatch.setitem(DRAFTERS, "lying", factory)
    counts, _, _ = sampled(target, "suffix", key="lying")
    assert goodness_of_fit(counts, exact).p_value < P_FLOOR


class _WordIds:
    """A tokenizer whose text is token ids separated by spaces."""

    def encode(self, text, add_special_tokens=False):
        return [int(word) for word in text.split()]


def test_a_corpus_file_drafts_through_the_engine_and_is_built_once(greedy_target, tmp_path):
    expected = run_strategy(Strategy("target", processor=GreedyProcessor(), max_gen_len=40),
                            pair_of(greedy_target), PROMPT).tokens
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(" ".join(map(str, [7, 7] + PROMPT + expected)))
    pair = pair_of(greedy_target, tokenizer=_WordIds())
    state = EngineState()
    strategy = Strategy("ngram", drafter="ngram", gamma=4, processor=GreedyProcessor(), max_gen_len=40,
                        drafter_options=NGramOptions(storage="sam", corpus=str(corpus), reset=False))
    first = run_strategy(strategy, pair, PROMPT, state=state)
    automaton = state.storage.corpus
    second = run_strategy(strategy, pair, PROMPT, state=state)
    assert first.tokens == second.tokens == expected
    assert state.storage.corpus is automaton                          # built once, kept across prompts
    assert first.trace[0].note == {"source": "corpus", "match": len(PROMPT)}
    assert first.accepted == first.drafted > 0                        # the corpus knew the whole output
    missing = replace_options(strategy, corpus=str(tmp_path / "none.txt"))
    with pytest.raises(ValueError, match="cannot read the corpus"):
        run_strategy(missing, pair, PROMPT, state=state)


@pytest.mark.parametrize("name, reason", [("none.txt", "No such file"), ("bad\0name.txt", "null byte"),
                                          ("latin1.txt", "can't decode"), (".", "Is a directory")])
def test_a_corpus_that_cannot_be_read_is_one_line_naming_the_file(tmp_path, name, reason):
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    path = str(tmp_path / name)
    with pytest.raises(ValueError) as caught:
        read_corpus(path, _WordIds())
    message = str(caught.value)
    assert message.startswith(f"cannot read the corpus {path!r}") and reason in message and "\n" not in message


def replace_options(strategy: Strategy, **changes) -> Strategy:
    return replace(strategy, drafter_options=replace(strategy.drafter_options, **changes))
