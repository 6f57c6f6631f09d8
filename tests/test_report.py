"""The HTML report: parsed back, every generated token has its element and the trace's numbers.

Real runs of tiny random models (so every round carries real inspector
numbers), a word tokenizer whose pieces include HTML's special characters.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from repl.report import report_html, write_report
from repl.runs import PromptRun, StrategyRun
from repl.trace import TraceError, prompt_record, read_trace, trace_document, write_trace
from tests.helpers.repl import ENV, infer
from tests.helpers.report import NASTY, PROMPT, HtmlTokenizer, Page, inspected_prompt_run, parse

@pytest.fixture(scope="module")
def prompt_run():
    return inspected_prompt_run()


def _tokens_of(page: Page, key: str) -> list[dict]:
    return [t for t, section in zip(page.tokens, page.sections) if section == key]


def test_every_generated_token_has_its_element_with_the_traces_numbers(prompt_run):
    page = parse(report_html([prompt_run], ENV))
    for run in prompt_run.runs:
        spans = _tokens_of(page, run.key)
        kinds = [t["class"].split()[1] for t in spans]
        generated = [t for t, kind in zip(spans, kinds) if kind != "rej"]
        assert [int(t["data-id"]) for t in generated] == run.result.tokens
        assert "".join(t["text"] for t in generated) == run.text
        # walk the trace: each round's drafts, then its token, with the recorded numbers
        expected = []
        for index, rnd in enumerate(run.result.trace):
            ins = rnd.inspection
            for i, x in enumerate(rnd.drafted):
                kind = "acc" if i < rnd.accepted else "rej"
                pos = ins.positions[i]
                expected.append((kind, index + 1, i, x, pos.p, pos.q, pos.accept, pos.entropy_p, pos.entropy_q))
            if rnd.token is not None:
                kind = "ar" if not run.drafting else "bonus" if rnd.bonus else "tgt"
                p = None if ins is None else ins.token_p
                h = None if ins is None else ins.token_entropy
                expected.append((kind, index + 1, rnd.accepted, rnd.token, p, None, None, h, None))

        def number(t, name):
            return float(t[name]) if name in t else None

        got = [(kind, int(t["data-round"]), int(t["data-position"]), int(t["data-id"]),
                number(t, "data-p"), number(t, "data-q"), number(t, "data-accept"),
                number(t, "data-entropy-p"), number(t, "data-entropy-q")) for t, kind in zip(spans, kinds)]
        assert got == expected
        if run.drafting:
            assert {"rej", "tgt"} <= set(kinds)
    assert "acc" in {t["class"].split()[1] for t in _tokens_of(page, "speculative")}
    # every span's tooltip names its round and position and, where recorded, p, q and acceptance
    for t in page.tokens:
        assert t["title"].startswith(f"round {t['data-round']} · position {t['data-position']}")
        if "data-q" in t:
            assert f"p {float(t['data-p']):.3f}" in t["title"] and f"accept {float(t['data-accept']):.3f}" in t["title"]


def test_a_mutated_number_is_caught(prompt_run, monkeypatch):
    """Swapping p and q in the page must fail the comparison above."""
    import repl.report as report

    real = report._span

    def swapped(piece, kind, label, numbers):
        if "q" in numbers:
            numbers = dict(numbers, p=numbers["q"], q=numbers["p"])
        return real(piece, kind, label, numbers)

    monkeypatch.setattr(report, "_span", swapped)
    with pytest.raises(AssertionError):
        test_every_generated_token_has_its_element_with_the_traces_numbers(prompt_run)


def test_the_page_is_self_contained_and_escaped(prompt_run):
    html = report_html([prompt_run], ENV)
    page = parse(html)
    tags = {tag for tag, _ in page.elements}
    assert "script" not in tags and "link" not in tags and "iframe" not in tags and "img" not in tags
    for tag, attrs in page.elements:
        assert not {"src", "href"} & set(attrs), (tag, attrs)
    assert "http://" not in html.replace("http://www.w3.org", "") and "https://" not in html
    text = "".join(page.text)
    assert NASTY in text                              # the prompt, as text, not as markup
    assert "<script>" not in html and "&lt;script&gt;" in html
    pieces = [t["text"] for t in page.tokens]
    assert " <i>&amp;" in pieces and ' "q"&' in pieces  # token text comes back exactly
    assert page.elements[0][0] == "html" and html.count("<svg") == 4  # phase and acceptance charts, twice
    assert "Comparison" in text and "Target AR" in text and "baseline" in text


def test_charts_carry_each_rounds_times(prompt_run):
    page = parse(report_html([prompt_run], ENV))
    spec = prompt_run.runs[0].result.trace
    svgs = [attrs for tag, attrs in page.elements if tag == "svg"]
    assert [s["class"] for s in svgs] == ["phases", "acceptance", "phases", "acceptance"]
    tips = [t for t in page.text if t.startswith("round ") and "draft" in t and "verify" in t]
    assert tips[:len(spec)] == [f"round {i + 1}: draft {r.draft_s * 1000:.1f} ms, verify {r.verify_s * 1000:.1f} ms, "
                                f"{len(r.drafted)} drafted, {r.accepted} accepted" for i, r in enumerate(spec)]


def test_replay_writes_the_same_report_from_a_trace(prompt_run, tmp_path):
    trace_path, html_path = tmp_path / "t.json", tmp_path / "r.html"
    write_trace(str(trace_path), trace_document([prompt_record(prompt_run, HtmlTokenizer())], ENV))
    done = infer(["--replay", str(trace_path), "--html", str(html_path)], tmp_path)
    assert done.returncode == 0, done.stderr
    assert "report written to" in done.stdout
    back = read_trace(str(trace_path))
    assert html_path.read_text() == report_html(back.prompts, back.environment, created=back.created)
    live = parse(report_html([prompt_run], ENV))
    replayed = parse(html_path.read_text())
    assert [t for t in replayed.tokens] == [t for t in live.tokens]


def test_html_needs_replay_and_a_bad_path_is_one_line(prompt_run, tmp_path):
    done = infer(["--html", str(tmp_path / "r.html")], tmp_path)
    assert done.returncode == 2 and "--html needs --replay" in done.stderr and "Traceback" not in done.stderr
    with pytest.raises(TraceError, match="cannot write report to"):
        write_report(str(tmp_path / "no" / "r.html"), [prompt_run], ENV)
    with pytest.raises(TraceError, match="it is a directory"):
        write_report(str(tmp_path), [prompt_run], ENV)


def test_an_old_trace_without_pieces_still_makes_a_page(prompt_run):
    run = prompt_run.runs[2]
    old = StrategyRun(run.key, run.result, text="plain <text>")
    pr = PromptRun("p", PROMPT, greedy=False, runs=[old], settings=prompt_run.settings)
    page = parse(report_html([pr], ENV))
    assert not page.tokens and "plain <text>" in "".join(page.text) and "no per-token text" in "".join(page.text)


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _browser(path) -> tuple[str, list[str]]:
    """The DOM headless chromium rendered from ``path``, and the script errors it logged."""
    done = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                           "--disable-background-networking", "--enable-logging=stderr", "--v=0",
                           "--dump-dom", path.as_uri()], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout, [line for line in done.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium)")
def test_the_page_renders_in_a_headless_browser(prompt_run, tmp_path):
    path = tmp_path / "r.html"
    write_report(str(path), [prompt_run], ENV)
    dom, errors = _browser(path)
    assert not errors, errors
    assert len(parse(dom).tokens) == len(parse(path.read_text()).tokens) > 0
    # the check has power: a page with a failing script is caught
    broken = tmp_path / "broken.html"
    broken.write_text(path.read_text().replace("</body>", "<script>undefined_function()</script></body>"))
    assert any("undefined_function" in line for line in _browser(broken)[1])


def _suffix_prompt_run():
    """NASD over the suffix storage on a tiny model (greedy), recorded as the REPL records it."""
    import torch
    from engine import NGramOptions, Strategy, pair_of, run_strategy
    from repl.settings import Settings
    from sampling import GreedyProcessor
    from tests.helpers.models import tiny_llama
    from tests.helpers.report import V

    target = tiny_llama(1, vocab_size=V, logit_scale=6.0)
    prompt = [1, 5, 9, 5, 9, 5, 9, 3, 7, 5, 9, 5, 9, 5, 9, 3, 7, 5, 9]
    strategy = Strategy("ngram", drafter="ngram", drafter_options=NGramOptions(storage="suffix"), gamma=4,
                        processor=GreedyProcessor(), max_gen_len=24)
    result = run_strategy(strategy, pair_of(target), prompt, generator=torch.Generator().manual_seed(0))
    pr = PromptRun("suffix", prompt, greedy=True, settings=Settings(gamma=4, chat=False).to_dict())
    tokenizer = HtmlTokenizer()
    pr.runs = [StrategyRun("ngram", result, text=tokenizer.decode(result.tokens))]
    prompt_record(pr, tokenizer)
    return pr


def check_sources(page: Page, html: str, pr: PromptRun) -> None:
    """Every draft span names its round's source and match; the sources table has the /stats numbers."""
    run = pr.runs[0]
    notes = [rnd.note for rnd in run.result.trace for _ in rnd.drafted]
    drafts = [t for t in _tokens_of(page, "ngram") if t["class"].split()[1] in ("acc", "rej")]
    assert len(drafts) == len(notes) > 0
    assert [(t["data-source"], int(t["data-match"])) for t in drafts] == \
        [(n["source"] or "none", n["match"]) for n in notes]
    sources = pr.why(run).sources["draft_sources"]
    rows = [attrs["data-source"] for tag, attrs in page.elements if tag == "tr" and "data-source" in attrs]
    assert rows == list(sources)
    for source, c in sources.items():
        assert f'<tr data-source="{source}">' in html
        assert f"<td>{c['rounds']}</td><td>{c['accepted']}/{c['drafted']}</td>" in html
    by_match = pr.why(run).sources["acceptance_by_match"]
    assert by_match and sum(c["drafted"] for c in by_match.values()) == sum(
        c["drafted"] for s, c in sources.items() if s != "none")
    for label, c in by_match.items():
        assert f"{label}: {c['accepted']}/{c['drafted']} ({c['acceptance']:.0%})" in html


def test_a_match_drafters_sources_are_on_each_draft_and_in_a_table():
    pr = _suffix_prompt_run()
    assert any(rnd.drafted and rnd.accepted < len(rnd.drafted) for rnd in pr.runs[0].result.trace)
    html = report_html([pr], ENV)
    check_sources(parse(html), html, pr)
    # the copy ceiling, as /stats gives it
    ceiling = pr.why(pr.runs[0]).ceiling
    assert ceiling["gamma"] == 4 and ceiling["after_1"] >= pr.runs[0].result.tokens_per_target_call
    assert (f"<p class=\"meta\" data-ceiling>copy ceiling at γ 4: at most {ceiling['after_1']:.2f} tokens a "
            f"target call") in html


def test_a_draft_given_another_rounds_source_is_caught(monkeypatch):
    """Mutation: every round is labelled with the first drafting round's note."""
    import repl.report

    pr = _suffix_prompt_run()
    notes = [rnd.note for rnd in pr.runs[0].result.trace if rnd.drafted]
    assert len({(n["source"], n["match"]) for n in notes}) > 1
    monkeypatch.setattr(repl.report, "match_note", lambda rnd: notes[0])
    html = report_html([pr], ENV)
    with pytest.raises(AssertionError):
        check_sources(parse(html), html, pr)
