"""Real runs for the report and inspector-view tests: speculative, NASD and target AR on
tiny random models (every round carries real inspector numbers), a word tokenizer
whose pieces include HTML's special characters, and an HTML page parsed back."""

from __future__ import annotations

from html.parser import HTMLParser

import torch

from ngram_assisted import NGramStorage
from repl.runs import PromptRun, StrategyRun
from repl.settings import Settings
from repl.trace import prompt_record
from sampling import MultinomialProcessor
from tests.helpers.decode import autoregressive, nasd, speculative
from tests.helpers.models import tiny_llama
from tests.helpers.repl import WordTokenizer

V = 64
PROMPT = [1, 5, 9, 5, 9, 5, 9, 3, 7]
NASTY = '<script>alert("x")</script> & <b>'


class HtmlTokenizer(WordTokenizer):
    """Token 9 decodes to markup, token 12 to a quote and an ampersand."""

    def decode(self, ids, skip_special_tokens=False):
        words = {9: " <i>&amp;", 12: ' "q"&'}
        return "".join(words.get(i, f" w{i}") for i in ids if not (skip_special_tokens and i < 2))


def inspected_prompt_run(processor=None, *, greedy: bool = False) -> PromptRun:
    """Speculative, NASD and target AR on tiny random models; each run's pieces decoded."""
    processor = processor or MultinomialProcessor(1.0)
    target = tiny_llama(1, vocab_size=V, logit_scale=6.0)
    drafter = tiny_llama(2, vocab_size=V, logit_scale=6.0)
    common = dict(processor=processor, max_gen_len=20)
    results = {
        "speculative": speculative(PROMPT, drafter, target, gamma=4, generator=torch.Generator().manual_seed(3),
                                   **common),
        "ngram": nasd(PROMPT, NGramStorage(2, V), target, gamma=3, confident_start=False,
                      generator=torch.Generator().manual_seed(4), **common),
        "target": autoregressive(PROMPT, target, generator=torch.Generator().manual_seed(5), **common),
    }
    pr = PromptRun(NASTY, PROMPT, greedy=greedy, settings=Settings(gamma=4, chat=False).to_dict())
    tokenizer = HtmlTokenizer()
    pr.runs = [StrategyRun(key, r, text=tokenizer.decode(r.tokens)) for key, r in results.items()]
    prompt_record(pr, tokenizer)  # fills each run's pieces and the prompt's token text
    return pr


class Page(HTMLParser):
    """Every element's tag and attributes, every token span, the text, in order."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.elements: list[tuple[str, dict]] = []
        self.tokens: list[dict] = []   # attributes of each token span, plus its text
        self.sections: list[str] = []  # the strategy key each token span belongs to
        self.text: list[str] = []
        self._open: dict | None = None
        self._section: str | None = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.elements.append((tag, attrs))
        if tag == "section" and "data-key" in attrs:
            self._section = attrs["data-key"]
        if tag == "span" and "tok" in attrs.get("class", "").split():
            self._open = dict(attrs, text="")
            self.tokens.append(self._open)
            self.sections.append(self._section)

    def handle_endtag(self, tag):
        if tag == "span":
            self._open = None

    def handle_data(self, data):
        self.text.append(data)
        if self._open is not None:
            self._open["text"] += data


def parse(html: str) -> Page:
    page = Page()
    page.feed(html)
    page.close()
    return page
