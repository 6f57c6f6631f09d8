"""Live rounds: the engine's observer hook, the injected round trip, the live view.

Tiny random Llamas (a drafter initialised independently of the target, so
rounds reject and roll back) and a word tokenizer; the session test uses the
tiny local pair of the REPL tests.
"""

from __future__ import annotations

import io
import re
import time

import pytest


from engine import NGramOptions, Strategy, run_strategy
from generation import observer as observer_module
from generation.result import Round
from repl import live, render
from repl.runner import strategy_for
from repl.settings import Settings
from sampling.spec import ProcessorSpec
from tests.helpers.models import tiny_llama
from tests.helpers.pairs import model_pair

PROMPT = [3, 17, 5, 9, 22, 5, 9]


@pytest.fixture(scope="module")
def models():
    return tiny_llama(1, logit_scale=8.0), tiny_llama(2, logit_scale=8.0)


class Recorder:
    """Records every call; ``sleep`` seconds inside each (a slow drawer)."""

    def __init__(self, sleep: float = 0.0):
        self.sleep = sleep
        self.calls: list[tuple] = []

    def drafted(self, draft):
        self.calls.append(("drafted", list(draft)))
        time.sleep(self.sleep)

    def round(self, rnd, new_tokens, elapsed_s):
        self.calls.append(("round", rnd, list(new_tokens), elapsed_s))
        time.sleep(self.sleep)


def strategies(models):
    """Each strategy run through the engine: ``observer`` goes to ``run_strategy``,
    ``target_delay_s`` into the ``Strategy``."""
    target, drafter = models
    pair = model_pair(target, drafter)
    kinds = {"speculative": ("model", None), "ngram": ("ngram", NGramOptions(n=2)),
             "target": (None, None), "drafter": (None, None)}

    def runner(key):
        kind, options = kinds[key]

        def run(observer=None, target_delay_s=0.0):
            strategy = Strategy(key, drafter=kind, drafter_options=options, gamma=4,
                                model="drafter" if key == "drafter" else "target",
                                processor=ProcessorSpec("greedy"), max_gen_len=40, target_delay_s=target_delay_s)
            return run_strategy(strategy, pair, PROMPT, observer=observer)
        return run
    return {key: runner(key) for key in kinds}


# ------------------------------------------------------------ the observer hook

@pytest.mark.parametrize("key", ["speculative", "ngram", "target"])
def test_the_observer_sees_every_round_and_changes_nothing(models, key):
    run = strategies(models)[key]
    plain = run()
    recorder = Recorder()
    watched = run(observer=recorder)
    assert watched.tokens == plain.tokens
    assert [(r.drafted, r.accepted, r.token) for r in watched.trace] == \
        [(r.drafted, r.accepted, r.token) for r in plain.trace]
    rounds = [c for c in recorder.calls if c[0] == "round"]
    assert [c[1] for c in rounds] == watched.trace          # each round, in order
    assert sum((c[2] for c in rounds), []) == watched.tokens  # what each round appended
    elapsed = [c[3] for c in rounds]
    assert elapsed == sorted(elapsed) and 0 < elapsed[-1] <= watched.seconds + 1e-3
    if key != "target":
        # drafts are announced before their round ends, and they are the round's drafts
        for i, call in enumerate(recorder.calls):
            if call[0] == "round":
                assert recorder.calls[i - 1][0] == "drafted"
                assert tuple(recorder.calls[i - 1][1]) == call[1].drafted or call[1].token is None
        assert any(r.rejected for r in watched.trace)  # rejections ran
    else:
        assert all(c[0] == "round" for c in recorder.calls)


def _observer_time_is_left_out(run) -> bool:
    sleep = 0.02
    recorder = Recorder(sleep)
    t0 = time.perf_counter()
    result = run(observer=recorder)
    wall = time.perf_counter() - t0
    slept = sleep * len(recorder.calls)
    phases = result.phases
    assert abs(phases["draft"] + phases["verify"] + phases["other"] - result.seconds) < 1e-9
    return result.seconds <= wall - slept + 0.01 and phases["other"] < slept / 2


@pytest.mark.parametrize("key", ["speculative", "target"])
def test_time_inside_the_observer_is_left_out_of_seconds(models, key, monkeypatch):
    run = strategies(models)[key]
    assert _observer_time_is_left_out(run)
    # Mutation check: a watch that forgets to count its pauses is caught.
    monkeypatch.setattr(observer_module.Watch, "paused_s", property(lambda self: 0.0, lambda self, v: None),
                        raising=False)
    assert not _observer_time_is_left_out(run)


# ------------------------------------------------------------ the injected round trip

@pytest.mark.parametrize("key", ["speculative", "ngram", "target"])
def test_the_injected_round_trip_is_paid_before_every_target_forward_as_verify_time(models, key, monkeypatch):
    delay = 0.015
    run = strategies(models)[key]
    plain = run()
    slowed = run(target_delay_s=delay)
    assert slowed.tokens == plain.tokens
    assert all(r.verify_s >= delay for r in slowed.trace)
    if key != "speculative":  # the wait is never booked as drafting
        assert slowed.phases["draft"] < delay * slowed.target_calls / 2
    assert slowed.phases["verify"] >= delay * slowed.target_calls <= slowed.seconds  # one wait per target call
    # Mutation check: without the wait the verify times fall under it.
    monkeypatch.setattr("generation.verify.target_delay", lambda s, d: None)
    monkeypatch.setattr("generation.autoregressive.target_delay", lambda s, d: None)
    assert not all(r.verify_s >= delay for r in run(target_delay_s=delay).trace)


def test_the_drafter_alone_never_waits_and_the_repl_setting_reaches_the_engine(models):
    delay = 0.05
    slowed = strategies(models)["drafter"](target_delay_s=delay)
    assert slowed.seconds < delay * len(slowed.trace) / 2  # no target call, no round trip
    settings = Settings(rtt_inject=25.0)
    assert [strategy_for(key, settings).target_delay_s for key in ("speculative", "ngram", "target")] == [0.025] * 3


# ------------------------------------------------------------ the live view

class WordTokenizer:
    def decode(self, ids, skip_special_tokens=False):
        return "".join(f" w{i}" for i in ids)


def styled(text):
    return [(text.plain[s.start:s.end], str(s.style)) for s in text.spans]


def test_live_view_shows_pending_drafts_dim_then_the_debug_colours():
    frames = []
    view = live.LiveView("speculative", WordTokenizer(), [2, 3], draw=frames.append, interval=0.0)
    view.drafted([5, 6, 7])
    assert styled(frames[-1].renderable.renderables[0]) == [(" w5 w6 w7", live.PENDING)]
    view.round(Round(drafted=(5, 6, 7), accepted=2, token=8, bonus=False, gamma=4, draft_s=0.3, verify_s=0.1),
               [5, 6, 8], 0.5)
    view.drafted([9])
    view.round(Round(drafted=(9,), accepted=1, token=10, bonus=True, gamma=1, draft_s=0.1, verify_s=0.1),
               [9, 10], 1.0)
    body = view.body()
    assert body.plain == "⁴ w5 w6 w7 w8¹ w9 w10"
    assert styled(body) == [("⁴", render.GAMMA_MARK), (" w5", render.ACCEPTED), (" w6", render.ACCEPTED),
                            (" w7", render.REJECTED), (" w8", render.TARGET), ("¹", render.GAMMA_MARK),
                            (" w9", render.ACCEPTED), (" w10", render.BONUS)]
    assert view.status() == ("live · round 2 · 5 tokens · 5.0 tokens/s · acceptance 75% (3/4) · "
                             "draft 0.40 s / verify 0.20 s (67/33%)")
    assert len(frames) == 4


def test_live_view_draws_at_most_once_per_interval():
    now = [0.0]
    frames = []
    view = live.LiveView("target", WordTokenizer(), [2], draw=frames.append, interval=0.1, clock=lambda: now[0])
    for i in range(30):  # 30 steps, 10 ms apart: 0.3 s
        view.round(Round(drafted=(), accepted=0, token=4 + i, bonus=False, verify_s=0.01), [4 + i], 0.01 * i)
        now[0] += 0.01
    assert len(frames) == 3 and view.text.plain == "".join(f" w{4 + i}" for i in range(30))
    assert styled(view.text) == []  # AR text is plain


# ------------------------------------------------------------ a session: live on == live off

@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    from tests.helpers.repl import build_pair
    from utils.models import load_pair

    target, drafter = build_pair(tmp_path_factory.mktemp("live_pair"))
    return load_pair(str(target), str(drafter), device="cpu")


NUMBERS = re.compile(r"-?\d+\.\d+|\d+(?=%)")  # timings and their shares


def test_the_final_panels_are_the_same_with_live_on_and_off(tiny_pair, monkeypatch):
    from rich.console import Console

    from repl.runner import Runner
    from repl.session import Session
    from repl.settings import Settings

    monkeypatch.setattr(live, "REFRESH_S", 0.0)  # draw on every call: the most drawing there can be
    runner = Runner(tiny_pair)
    panels: dict[str, list[str]] = {}
    draws = []
    real_panel = live.live_panel

    class Manager:
        def __init__(self, *args, **kwargs):
            self.inner = real_panel(*args, **kwargs)

        def __enter__(self):
            view = self.inner.__enter__()
            draws.append(view)
            return view

        def __exit__(self, *exc):
            return self.inner.__exit__(*exc)

    monkeypatch.setattr(live, "live_panel", Manager)
    for mode in ("on", "off"):
        out = io.StringIO()
        terminal = Console(file=out, force_terminal=True, width=160, height=30, markup=False, emoji=False,
                           highlight=False)
        session = Session(runner, Settings(length=24, live=mode == "on", debug=True), terminal)
        assert session.live() is (mode == "on")
        shown = []
        session.show_run = lambda prompt_run, run, s=session: shown.append(
            _plain(render.strategy_panel(run, prompt_run.prompt_ids, runner.pair.tokenizer, debug=True,
                                         prompt_run=prompt_run)))
        assert session.prompt("the water is hot") is not None
        panels[mode] = [re.sub(r" +", " ", NUMBERS.sub("#", p)) for p in shown]  # padding follows the digits
    assert len(panels["on"]) == len(panels["off"]) == 3
    for on, off in zip(panels["on"], panels["off"]):
        differ = [(a, b) for a, b in zip(on.splitlines(), off.splitlines()) if a != b]
        assert on == off, differ
    assert [v.key for v in draws] == ["speculative", "ngram", "target"]
    assert all(v.draws >= 2 for v in draws) and all(v.tokens == 24 for v in draws)


def _plain(renderable) -> str:
    from rich.console import Console

    out = io.StringIO()
    Console(file=out, width=160, color_system=None, markup=False, emoji=False, highlight=False).print(renderable)
    return out.getvalue()
