"""Lookahead decoding (``ngram_assisted.lookahead``; docs/lookahead.md).

The pool, the candidate tree and the Jacobi window are checked on hand-made values (the
window's rows against the paper's rule, written out here independently of the code's
ancestors). Through the engine's one way in: greedy output equals target AR on several
prompts with candidates accepted and rejected; the cache holds exactly the sequence when
each round starts; every logit the verify pass returns (candidates and window rows) equals
an uncached forward of that row's own context. Under sampling, the first three tokens on an
8-token vocabulary follow the target's exact distribution. Each guarantee has a mutation
beside it that must fail: the window rows left in the cache, a window row that sees the
candidates, a fresh draw from p after rejected candidates.
"""

from __future__ import annotations

import pytest
import torch

import generation.tree_forward
import generation.tree_round
from checks.stats import goodness_of_fit
from engine import EngineState, LookaheadOptions, Strategy, lookahead_strategy, pair_of, run_strategy
from generation.tree import NO_EXTRA, ExtraRows, Tree, visibility
from ngram_assisted.lookahead import JacobiWindow, LookaheadDrafter, NGramPool, candidate_tree
from sampling import GreedyProcessor, MultinomialProcessor
from tests.helpers import arch_zoo
from tests.helpers.distribution import PROMPT as SAMPLING_PROMPT
from tests.helpers.distribution import exact_distribution
from tests.helpers.models import tiny_llama

# ------------------------------------------------------------------ the pool and the candidate tree


def test_the_pool_keeps_the_latest_g_per_first_token_most_recent_first():
    pool = NGramPool(guesses=2)
    pool.add(7, (1, 2))
    pool.add(7, (3, 4))
    pool.add(8, (5, 6))
    assert pool.candidates(7) == [(3, 4), (1, 2)] and len(pool) == 3
    pool.add(7, (1, 2))                                  # seen again: to the front, not twice
    assert pool.candidates(7) == [(1, 2), (3, 4)] and len(pool) == 3
    pool.add(7, (9, 9))                                  # a third for key 7: the oldest goes
    assert pool.candidates(7) == [(9, 9), (1, 2)] and len(pool) == 3
    assert pool.candidates(5) == []


def test_candidates_merge_into_one_tree_within_the_depth_and_node_budget():
    tree = candidate_tree([(1, 2, 3), (1, 4, 5), (6, 7, 8)], depth=3, nodes=9)
    assert tree.tokens == (1, 2, 3, 4, 5, 6, 7, 8)
    assert tree.parents == (-1, 0, 1, 0, 3, -1, 5, 6)    # the shared first token is one node
    assert tree.ranks == (0, 0, 0, 1, 0, 1, 0, 0)
    assert candidate_tree([(1, 2, 3), (1, 4, 5)], depth=2, nodes=9).tokens == (1, 2, 4)
    assert candidate_tree([(1, 2, 3), (1, 4, 5)], depth=3, nodes=4).tokens == (1, 2, 3, 4)
    assert len(candidate_tree([], depth=3, nodes=9)) == 0


# ------------------------------------------------------------------ the Jacobi window

def window_of(lines: list[list[int]]) -> JacobiWindow:
    window = JacobiWindow(len(lines[1]), len(lines), [0])
    window.lines = [list(line) for line in lines]
    return window


def paper_rule(width: int, levels: int) -> tuple[list[tuple[int, int]], dict, dict]:
    """Fu et al.'s lookahead mask, written out: the rows as (level, column) in feed order,
    what each sees among the rows, and its position after the root. Level 0's column 0 is
    the root; a level-0 token sees level 0 up to its column; a level-l token in column c sees
    level 0 up to column c, then levels 1..l of column c; (l, c) sits c + l after the root."""
    cells = [(0, c) for c in range(1, width)] + [(l, c) for l in range(1, levels) for c in range(width)]
    sees = {}
    for level, col in cells:
        own = {(0, c) for c in range(1, col + 1)}
        if level > 0:
            own |= {(l, col) for l in range(1, level + 1)}
        sees[(level, col)] = own
    return cells, sees, {cell: cell[0] + cell[1] for cell in cells}


@pytest.mark.parametrize("width, levels", [(3, 3), (4, 2), (1, 3)])
def test_the_window_rows_follow_the_lookahead_mask(width, levels):
    window = JacobiWindow(width, levels, [5, 6, 7])
    rows = window.rows()
    cells, sees, offset = paper_rule(width, levels)
    assert len(rows) == len(cells) == (width - 1) + (levels - 1) * width
    past, chain = 4, 1                                     # 4 cached tokens, then the root
    visible = visibility(Tree((), (), ()), past, chain, extra=rows)
    for i, cell in enumerate(cells):
        row = visible[chain + i]
        assert row[:past + chain].all()                    # the prefix and the root
        seen = {cells[j] for j in range(len(cells)) if row[past + chain + j]}
        assert seen == sees[cell], cell
        assert rows.depths[i] + 1 == offset[cell], cell    # position: root + 1 + depth


def test_extra_rows_and_candidates_never_see_each_other():
    tree = Tree((1, 2, 3), (-1, 0, -1), (0, 0, 1))
    rows = ExtraRows((4, 5), (-1, 0))
    past, chain = 2, 2
    visible = visibility(tree, past, chain, extra=rows)
    nodes = slice(past + chain, past + chain + 3)
    extra = slice(past + chain + 3, None)
    assert not visible[chain:chain + 3, extra].any()       # no candidate sees a window row
    assert not visible[chain + 3:, nodes].any()            # no window row sees a candidate
    assert visible[chain + 3:, extra].tolist() == [[True, False], [True, True]]
    assert visibility(tree, past, chain).equal(visible[:chain + 3, :past + chain + 3])


def test_the_window_closes_one_ngram_per_column_and_moves_one_step():
    a1, a2, b0, b1, b2, c0, c1, c2 = 11, 12, 20, 21, 22, 30, 31, 32
    window = window_of([[a1, a2], [b0, b1, b2], [c0, c1, c2]])     # W 3, N 4
    pool = NGramPool(guesses=4)
    window.advance(9, [40, 41, 42], pool)
    assert pool.candidates(9) == [(b0, c0, 40)]                    # column 0 starts at the root
    assert pool.candidates(a1) == [(b1, c1, 41)]
    assert pool.candidates(a2) == [(b2, c2, 42)]
    assert window.lines == [[b1, b2], [c0, c1, c2], [40, 41, 42]]


def test_the_drafter_refuses_n_below_three():
    with pytest.raises(ValueError, match="at least 3"):
        LookaheadDrafter(4, 2, 4)


# ------------------------------------------------------------------ greedy: the target's own output

V_GREEDY = 64
PROMPTS = (
    [8, 5, 17, 33, 1, 8, 5, 17, 12, 2, 8, 5, 17, 33, 3, 8, 5, 17],
    [1, 2, 3, 4, 5, 6, 7],
    [40, 41, 42, 43, 40, 41, 44, 45, 40, 41],
    [9, 60, 3, 22, 9, 60, 14],
)
LENGTH = 40
OPTIONS = (LookaheadOptions(5, 3, 5), LookaheadOptions(4, 4, 3), LookaheadOptions(2, 3, 1))


@pytest.fixture(scope="module")
def greedy_target():
    return tiny_llama(3, vocab_size=V_GREEDY, logit_scale=4.0)


def ar(target, prompt, length=LENGTH):
    return run_strategy(Strategy("target", processor=GreedyProcessor(), max_gen_len=length),
                        pair_of(target), prompt).tokens


def lookahead(target, prompt, options=LookaheadOptions(5, 3, 5), *, processor=GreedyProcessor(),
              length=LENGTH, generator=None):
    strategy = lookahead_strategy(options, processor=processor, max_gen_len=length)
    return run_strategy(strategy, pair_of(target), prompt, generator=generator)


def rejected_candidates(result) -> int:
    """Candidate nodes some round verified and did not keep."""
    return sum(r.tree_size - r.accepted for r in result.trace if r.token is not None)


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: f"W{o.window}-N{o.ngram}-G{o.guesses}")
def test_greedy_output_is_the_targets_with_candidates_accepted_and_rejected(greedy_target, options):
    accepted = rejected = 0
    for prompt in PROMPTS:
        result = lookahead(greedy_target, prompt, options)
        assert result.tokens == ar(greedy_target, prompt), prompt
        assert not result.tree_fallback and result.tree_rule == "top"
        assert all(r.tree_size <= options.nodes for r in result.trace)
        accepted += result.accepted
        rejected += rejected_candidates(result)
        assert result.target_calls == len(result.trace)    # one forward a round (the cache was empty at the start)
    assert accepted > 0 and rejected > 0                   # both paths ran


def test_rounds_note_their_candidates_and_the_pool(greedy_target):
    result = lookahead(greedy_target, PROMPTS[0])
    notes = [r.note for r in result.trace]
    assert all(n is not None and {"candidates", "pool"} <= set(n) for n in notes)
    assert all(n["candidates"] <= 5 for n in notes)
    assert any(n["candidates"] > 0 for n in notes) and notes[-1]["pool"] > 0
    assert all((r.tree_size > 0) <= (n["candidates"] > 0) for r, n in zip(result.trace, notes))


def test_a_strategy_without_trees_is_refused_in_one_line(greedy_target):
    strategy = Strategy("lookahead", drafter="lookahead", drafter_options=LookaheadOptions(), gamma=2,
                        processor=GreedyProcessor(), max_gen_len=8)
    with pytest.raises(ValueError, match="tree > 0") as info:
        run_strategy(strategy, pair_of(greedy_target), PROMPTS[0])
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("name", ["llama", "mistral", "gemma2"])
def test_other_families_equal_generate(name):
    """Llama, a sliding-window family (the window rows sit past the window's edge) and one with
    soft-capped logits, held to transformers' ``generate`` by the architecture matrix's check."""
    outcome = arch_zoo.guarded(lambda: arch_zoo.check_tree(name, "lookahead"))
    assert outcome.passed, outcome.detail


def test_a_family_without_trees_runs_target_ar_and_says_why_in_one_line():
    """T5 (an encoder-decoder: no tree path here, on every transformers this runs on)."""
    outcome = arch_zoo.guarded(lambda: arch_zoo.check_tree("t5", "lookahead"))
    assert outcome.passed, outcome.detail
    result = run_strategy(lookahead_strategy(LookaheadOptions(), processor=GreedyProcessor(),
                                             max_gen_len=8),
                          arch_zoo._pair(arch_zoo.build("t5")), list(arch_zoo.PROMPTS[0]))
    assert result.tree_fallback.startswith("chain instead of a tree: ") and "\n" not in result.tree_fallback
    assert result.drafted == 0


# ------------------------------------------------------------------ the cache and every logit

def recorded(monkeypatch, run):
    """Run ``run()`` with every tree verify pass recorded: (cache length before, ids, tree,
    extra rows, logits). Returns (records, the exception the run raised or None)."""
    records = []
    real = generation.tree_round.tree_forward

    def recording(cached, ids, tree, extra=NO_EXTRA):
        past = cached.length
        logits = real(cached, ids, tree, extra)
        records.append((past, ids[0].tolist(), tree, extra, logits.clone()))
        return logits

    monkeypatch.setattr(generation.tree_round, "tree_forward", recording)
    try:
        run()
    except Exception as error:  # noqa: BLE001  (a mutation may break the run itself)
        return records, error
    return records, None


def cache_pinned(records) -> bool:
    """Every round after the first began with the cache holding the sequence but its last token."""
    return bool(records) and all(past == len(ids) - 1 for past, ids, *_ in records[1:])


def test_the_cache_holds_exactly_the_sequence_when_each_round_starts(monkeypatch, greedy_target):
    records, error = recorded(monkeypatch, lambda: lookahead(greedy_target, PROMPTS[0]))
    assert error is None and cache_pinned(records)
    assert any(len(extra) for *_, extra, _ in records)


def test_window_rows_left_in_the_cache_are_caught(monkeypatch, greedy_target):
    """Mutation: after the pass, the cache keeps the accepted path but the window rows stay."""
    real = generation.tree_round.keep_path
    monkeypatch.setattr(generation.tree_round, "keep_path",
                        lambda cached, tree, path, extra=0: real(cached, tree, path))
    records, error = recorded(monkeypatch, lambda: lookahead(greedy_target, PROMPTS[0]))
    assert error is not None or not cache_pinned(records)


def row_contexts(ids: list[int], tree: Tree, extra: ExtraRows) -> list[list[int]]:
    """Each returned row's own context, by the rule the rows were fed under: the root's is
    the sequence; a node's its path of candidates; a window row's its trajectory."""
    def up(parents, i):
        chain = []
        while i >= 0:
            chain.append(i)
            i = parents[i]
        return chain[::-1]
    nodes = [ids + [tree.tokens[j] for j in up(tree.parents, i)] for i in range(len(tree))]
    rows = [ids + [extra.tokens[j] for j in up(extra.parents, i)] for i in range(len(extra))]
    return [ids] + nodes + rows


def wrong_rows(model, records) -> list[tuple[int, int, float]]:
    """(round, row, error) wherever a returned logit row differs from the uncached forward of
    its own context by more than 1e-4 of the largest logit."""
    bad = []
    with torch.inference_mode():
        for r, (_, ids, tree, extra, logits) in enumerate(records):
            for i, context in enumerate(row_contexts(ids, tree, extra)):
                want = model(torch.tensor([context])).logits[0, -1]
                error = (logits[i] - want).abs().max().item() / want.abs().max().item()
                if error > 1e-4:
                    bad.append((r, i, error))
    return bad


def test_every_row_of_the_pass_computes_its_own_context(monkeypatch, greedy_target):
    records, error = recorded(monkeypatch, lambda: lookahead(greedy_target, PROMPTS[0], LookaheadOptions(4, 4, 3),
                                                             length=16))
    assert error is None
    assert any(len(tree) for _, _, tree, _, _ in records)  # candidates and window rows in one pass
    assert wrong_rows(greedy_target, records) == []


def test_a_window_row_that_sees_the_candidates_is_caught(monkeypatch, greedy_target):
    """Mutation: the window rows see every candidate node as well as their trajectory."""
    real = generation.tree_forward.visibility

    def leaky(tree, past, chain, device=None, extra=NO_EXTRA):
        rows = real(tree, past, chain, device, extra)
        n = len(tree)
        rows[chain + n:, past + chain:past + chain + n] = True
        return rows

    monkeypatch.setattr(generation.tree_forward, "visibility", leaky)
    records, _ = recorded(monkeypatch, lambda: lookahead(greedy_target, PROMPTS[0], LookaheadOptions(4, 4, 3),
                                                         length=16))
    assert wrong_rows(greedy_target, records)


# ------------------------------------------------------------------ sampling: the target's distribution

# The pool is kept from run to run (reset off), so most rounds verify candidates; a fresh pool
# would have none in a run's first round and few in its next two.
SAMPLING_OPTIONS = LookaheadOptions(window=4, ngram=3, guesses=4, reset=False)
SAMPLES = 300        # the mutation below sits some 15 standard deviations out at this count
P_FLOOR = 1e-4       # a correct sampler fails this once in 10,000 runs


@pytest.fixture(scope="module")
def exact(target):
    return exact_distribution(target, MultinomialProcessor(1.0))


def sampled(target) -> tuple[dict, int, int]:
    """Counts of the first three tokens over SAMPLES runs sharing one pool, and the candidate
    nodes accepted and rejected."""
    generator = torch.Generator().manual_seed(1234)
    strategy = lookahead_strategy(SAMPLING_OPTIONS, processor=MultinomialProcessor(1.0), max_gen_len=3)
    pair, state, counts, accepted, rejected = pair_of(target), EngineState(), {}, 0, 0
    with torch.inference_mode():
        for _ in range(SAMPLES):
            r = run_strategy(strategy, pair, SAMPLING_PROMPT, state=state, generator=generator)
            counts[tuple(r.tokens)] = counts.get(tuple(r.tokens), 0) + 1
            accepted, rejected = accepted + r.accepted, rejected + rejected_candidates(r)
    return counts, accepted, rejected


def test_sampling_keeps_the_target_distribution(target, exact):
    counts, accepted, rejected = sampled(target)
    assert accepted > 0 and rejected > 0                    # both paths ran
    fit = goodness_of_fit(counts, exact)
    assert fit.p_value > P_FLOOR, fit.describe()


def fresh_draw_after_rejection(real):
    """Mutation: where the walk stopped at a node with candidates below it (all rejected), the
    round's token is drawn afresh from p instead of being the draw no candidate matched."""
    def accept(p, tokens, parents, ancestors, sample, generator=None):
        n, deepest, token = real(p, tokens, parents, ancestors, sample, generator)
        had_candidates = (parents == deepest).any()
        fresh = sample(p[(deepest + 1).view(1)], generator)[0]
        return n, deepest, torch.where(had_candidates, fresh, token)
    return accept


def test_a_fresh_draw_after_rejected_candidates_is_caught(monkeypatch, target, exact):
    monkeypatch.setattr(generation.tree_round, "accept_tree",
                        fresh_draw_after_rejection(generation.tree_round.accept_tree))
    counts, _, _ = sampled(target)
    assert goodness_of_fit(counts, exact).p_value < P_FLOOR


# ------------------------------------------------------------------ the pool across prompts

def test_the_pool_is_kept_across_prompts_only_without_reset(greedy_target):
    pair, state = pair_of(greedy_target), EngineState()
    kept = LookaheadOptions(5, 3, 5, reset=False)

    def run(options):
        return run_strategy(lookahead_strategy(options, processor=GreedyProcessor(), max_gen_len=LENGTH),
                            pair, PROMPTS[0], state=state)

    first = run(kept)
    second = run(kept)              # the first run's round 1 left an n-gram keyed by the prompt's last token
    assert second.tokens == first.tokens == ar(greedy_target, PROMPTS[0])
    assert first.trace[0].note["candidates"] == 0 and second.trace[0].note["candidates"] > 0
    fresh = run(LookaheadOptions(5, 3, 5, reset=True))
    assert fresh.tokens == first.tokens and fresh.trace[0].note["candidates"] == 0


# ------------------------------------------------------------------ the REPL: command, panel, JSON

def test_the_repl_runs_lookahead_with_its_own_settings_and_reports_it(tmp_path):
    from repl import render
    from repl.commands import execute
    from repl.runner import Runner, strategy_for
    from repl.settings import Settings
    from tests.helpers.repl import build_model, build_tokenizer, console

    settings = Settings(speculative=False, ngram=False, length=24, chat=False)
    for line in ("/lookahead on", "/lookahead_window 4", "/lookahead_ngram 4", "/lookahead_guesses 3"):
        assert execute(line, settings).ok, line
    refused = execute("/lookahead_ngram 2", settings)
    assert not refused.ok and "\n" not in refused.message and settings.lookahead_ngram == 4
    strategy = strategy_for("lookahead", settings)
    assert strategy.drafter_options == LookaheadOptions(4, 4, 3, reset=True)
    assert (strategy.gamma, strategy.tree) == (3, 9)
    tokenizer = build_tokenizer()
    pair = pair_of(build_model(1, len(tokenizer), context=512), tokenizer=tokenizer)
    runner = Runner(pair)
    prompt_run = runner.run(runner.prepare("the cat and the dog and the cat and the", settings), settings)
    runs = {r.key: r for r in prompt_run.runs}
    assert set(runs) == {"lookahead", "target"} and runs["lookahead"].error is None
    assert runs["lookahead"].result.tokens == runs["target"].result.tokens
    entry = prompt_run.to_dict()["strategies"]["lookahead"]
    assert entry["identical_to_target"] is True
    stats = entry["lookahead_stats"]
    assert stats["rounds"] == len(runs["lookahead"].result.trace) and stats["pool"] > 0
    assert stats["tokens_per_target_call"] == pytest.approx(entry["tokens_per_target_call"])
    con, out = console()
    con.print(render.strategy_panel(runs["lookahead"], prompt_run.prompt_ids, tokenizer, debug=True,
                                    prompt_run=prompt_run))
    text = out.getvalue()
    assert "tokens/target call" in text and "accepted n-gram length" in text and "pool" in text
