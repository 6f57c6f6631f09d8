"""The drafter kinds (``engine.kinds``): a new kind is a package and one registration line.

The toy kind of docs/engine.md is executed as written; the registry's kinds each answer for their own
specs and modules, and the engine asks them, not their names.
"""

from __future__ import annotations

import pytest

import engine.kinds
from engine import decodes_alone_reason
from engine.kinds import KINDS, kind_of_module, kind_of_spec
from sampling import GreedyProcessor
from tests.helpers.decode import autoregressive
from tests.helpers.doc_blocks import python_block, run_example
from tests.helpers.models import tiny_llama


@pytest.fixture
def registry():
    """Put KINDS back as it was after each test (the example registers a kind)."""
    saved = list(KINDS)
    try:
        yield KINDS
    finally:
        KINDS[:] = saved


def test_doc_example_kind_drafts_through_the_engine_and_is_lossless(registry):
    target, prompt_ids = tiny_llama(0, logit_scale=8.0), [5, 6, 7, 7, 7, 8, 9, 9, 9]
    scope = run_example("engine.md", "register_kind(", target=target, prompt_ids=prompt_ids)
    greedy = autoregressive(prompt_ids, target, processor=GreedyProcessor(), max_gen_len=24)
    assert scope["result"].tokens == greedy.tokens
    assert scope["result"].drafted > 0, "the example kind never drafted: the test would not judge anything"
    assert kind_of_module(scope["pair"].drafter) is scope["ECHO"] is kind_of_spec("echo")


def test_without_its_registration_line_the_toy_kind_is_not_the_engines(registry):
    # Mutation check: the example with its registration line removed drafts with no kind, so the
    # engine takes the module for an ordinary drafter model (it has no config) and the run fails.
    edited = python_block("engine.md", "register_kind(").replace("register_kind(ECHO)", "pass")
    with pytest.raises(AttributeError, match="config"):
        run_example("engine.md", "register_kind(", edited, target=tiny_llama(0, logit_scale=8.0), prompt_ids=[5, 6, 7])


def test_each_kind_answers_for_its_own_spec_and_no_other():
    specs = {"self:int8": "self", "mtp": "mtp", "eagle3:some/head": "eagle3",
             "gemma4-assistant:dir": "gemma4_assistant"}
    for spec, name in specs.items():
        assert kind_of_spec(spec).name == name
    for spec in (None, "HuggingFaceTB/SmolLM2-135M-Instruct", "self", "./mtp-model"):
        assert kind_of_spec(spec) is None


def test_an_ordinary_model_has_no_kind_and_decodes_alone():
    model = tiny_llama(0)
    assert kind_of_module(model) is None and decodes_alone_reason(model) is None
    assert kind_of_module(None) is None


def test_the_registry_lists_each_kind_once_by_name():
    names = [kind.name for kind in engine.kinds.KINDS]
    assert sorted(names) == sorted(set(names)) == ["cross_tokenizer", "eagle3", "gemma4_assistant", "mtp", "self"]


def test_the_doc_kind_is_advised_benchmarked_and_run_or_refused_on_the_static_path(registry, tmp_path):
    """A kind written as docs/engine.md shows, with its one registration line and no other edit: the
    advisor replays it (through the verify loop, its counts a run's, labelled an estimate since the kind
    says nothing of its replay), ``bench.py`` benchmarks it as a user runs it, and the static path runs it
    or refuses it in one line, its tokens target AR's either way."""
    import json

    from advisor.recorded import record
    from advisor.replay import default_grid, method, replay_grid
    from bench.cli import main
    from engine import Strategy, run_strategy
    from tests.helpers.pairs import model_pair
    from tests.helpers.repl import build_model, build_tokenizer

    tokenizer = build_tokenizer()
    target = build_model(1, len(tokenizer), context=256)
    prompts = [[5, 6, 7, 7, 7, 8, 9, 5, 6, 7], [9, 9, 8, 7, 7, 7, 6, 9, 9, 8]]
    scope = run_example("engine.md", "register_kind(", target=target, prompt_ids=prompts[0])
    pair = model_pair(target, scope["pair"].drafter, tokenizer=tokenizer, end_tokens=[2], context_length=256,
                      vocab_size=target.config.vocab_size)

    m = method("model", None, 3)
    assert m.key in {g.key for g in default_grid(pair)}
    [entry] = replay_grid(pair, record(pair, prompts, 16), [m], max_gen_len=16)
    runs = [run_strategy(m.strategy(max_gen_len=16), pair, p) for p in prompts]
    assert (entry.replayed.calls, entry.replayed.drafted, entry.replayed.accepted) == \
        (sum(r.target_calls for r in runs), sum(r.drafted for r in runs), sum(r.accepted for r in runs))
    assert entry.replayed.drafted > 0 and entry.exactness == "estimated" and "never held to runs" in entry.note

    questions = tmp_path / "q.jsonl"
    questions.write_text(json.dumps({"question_id": 1, "category": "chat", "turns": ["the cat sat on the mat"]}))
    out = tmp_path / "out"
    assert main(["--prompts", str(questions), "--strategies", "speculative,target", "--gamma", "3", "--policies",
                 "none", "--length", "8", "--repeats", "1", "--no-chart", "--no-chat", "--out", str(out)],
                loader=lambda args: pair) == 0
    bench = json.loads((out / "bench.json").read_text())
    outputs = bench["outputs"]
    assert "speculative@3" in outputs and outputs["speculative@3"] == outputs["target"]

    greedy = run_strategy(Strategy("target", processor=GreedyProcessor(), max_gen_len=16), pair, prompts[0])
    static = run_strategy(Strategy("echo", drafter="model", gamma=3, processor=GreedyProcessor(), max_gen_len=16,
                                   compile="static"), pair, prompts[0])
    assert static.tokens == greedy.tokens
    report = static.compile
    assert report["requested"] == "static"
    assert report["path"] == "static" or (report["reason"] and "\n" not in report["reason"])
