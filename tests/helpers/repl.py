"""What the REPL tests share: a tiny local model pair saved for ``infer.py`` children
(no downloads), hand-built results and a word tokenizer for rendering, and running
``infer.py`` in a child process.

Two random 2-layer Llamas over a word-level vocabulary of a few hundred words,
saved with a fast tokenizer that has a chat template. The end and special
tokens get a zero output row, so greedy decoding practically never stops
early and a long generation really is long (for the Ctrl-C test).
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import types
from pathlib import Path

from generation import GenerationResult, Round
from repl import render
from repl.runs import PromptRun, StrategyRun
from repl.settings import Settings

REPO = Path(__file__).resolve().parents[2]
INFER = REPO / "infer.py"

SPECIALS = ["<pad>", "<s>", "</s>", "<unk>", "<|user|>", "<|assistant|>"]
WORDS = (
    "the of and to a in is it you that he was for on are with as I his they be at one have this "
    "from or had by hot word but what some we can out other were all there when up use your how "
    "said an each she which do their time if will way about many then them write would like so "
    "these her long make thing see him two has look more day could go come did number sound no "
    "most people my over know water than call first who may down side been now find any new work "
    "part take get place made live where after back little only round man year came show every "
    "good me give our under name very through just form sentence great think say help low line "
    "differ turn cause much mean before move right boy old too same tell does set three want air "
    "well also play small end put home read hand port large spell add even land here must big "
    "high such follow act why ask men change went light kind off need house picture try us again "
    "animal point mother world near build self earth father head stand own page should country "
    "found answer school grow study still learn plant cover food sun four between state keep eye "
    "never last let thought city tree cross farm hard start might story saw far sea draw left late "
    "run while press close night real life few north"
).split() + list(".,!?:;'\"()[]")
CHAT_TEMPLATE = (
    "{% for message in messages %}<|user|> {{ message['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(SPECIALS + list(dict.fromkeys(WORDS)))}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Whitespace()])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>",
        additional_special_tokens=["<|user|>", "<|assistant|>"],
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_model(seed: int, vocab_size: int, *, context: int, noise: float = 0.0):
    """A random Llama; ``noise`` > 0 perturbs its output layer (a drafter that
    agrees with the target most of the time)."""
    import torch

    from tests.helpers.models import tiny_llama

    model = tiny_llama(seed, vocab_size=vocab_size, max_positions=context, logit_scale=4.0,  # sharper distributions
                       bos_token_id=1, eos_token_id=2, pad_token_id=0)
    with torch.no_grad():
        model.lm_head.weight[: len(SPECIALS)] = 0.0  # specials (end token included) never win argmax
        if noise:
            gen = torch.Generator().manual_seed(seed + 1000)
            model.lm_head.weight.add_(noise * torch.randn(model.lm_head.weight.shape, generator=gen))
    return model


def build_pair(root: Path, *, context: int = 65536) -> tuple[Path, Path]:
    """Save a target and a drafter under ``root``; return their directories."""
    tokenizer = build_tokenizer()
    dirs = []
    for name, noise in (("target", 0.0), ("drafter", 0.03)):
        path = root / name
        build_model(1, len(tokenizer), context=context, noise=noise).save_pretrained(path)
        tokenizer.save_pretrained(path)
        dirs.append(path)
    return dirs[0], dirs[1]


def child_env(tmp: Path) -> dict:
    """Environment for an infer.py child: offline, quiet, own history file."""
    env = dict(os.environ)
    env.update(
        HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
        SPECDEC_HISTORY=str(tmp / "history"), TERM="xterm-256color",
        COLUMNS="200", LINES="50", PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1",
    )
    env.pop("NO_COLOR", None)
    return env


PYTHON = sys.executable


# ------------------------------------------------ rendering without models

class WordTokenizer:
    """Token i decodes to " w<i>"; ids 0 and 1 are special (hidden when skipped)."""

    chat_template = None

    def decode(self, ids, skip_special_tokens=False):
        return "".join(f" w{i}" for i in ids if not (skip_special_tokens and i < 2))

    def __call__(self, text, add_special_tokens=True):
        return types.SimpleNamespace(input_ids=[int(w[1:]) for w in text.split()])

    def __len__(self):
        return 100


def console() -> tuple:
    out = io.StringIO()
    return render.make_console().__class__(file=out, width=200, markup=False, emoji=False,
                                           highlight=False, color_system=None), out


def result(tokens, seconds=1.0, **kw) -> GenerationResult:
    return GenerationResult(tokens=list(tokens), seconds=seconds, target_calls=kw.pop("target_calls", len(tokens)),
                            **kw)


def fake_pair(context=1000):
    from tests.helpers.pairs import model_pair

    return model_pair(tokenizer=WordTokenizer(), context_length=context, vocab_size=100,
                      device="cuda:0", end_tokens=[1], target_name="t", drafter_name="d")


def why_prompt_run() -> PromptRun:
    """A speculative run whose predicted speedup is known by hand (see the asserts).

    Rounds after the first (which carries the prefill): drafter step 0.01 s,
    verify at width 3 0.1 s, other 0.01 s per round; target AR: 0.05 s per
    verify + 0.01 s other = 0.06 s per token. Acceptance: position 0 2/3,
    position 1 2/2, so E(2) = 1 + 2/3 + 2/3 = 7/3 and the prediction at gamma 2 is
    (7/3) * 0.06 / (2 * 0.01 + 0.1 + 0.01) = 0.14 / 0.13.
    """
    spec_trace = [
        Round((5, 6), 2, 7, True, gamma=2, draft_s=0.02, verify_s=0.5),
        Round((8, 9), 2, 10, True, gamma=2, draft_s=0.02, verify_s=0.1),
        Round((11, 12), 0, 13, False, gamma=2, draft_s=0.02, verify_s=0.1),
    ]
    spec = result([5, 6, 7, 8, 9, 10, 13], seconds=0.8, drafted=6, accepted=4, target_calls=3,
                  drafter_calls=6, trace=spec_trace, phases={"draft": 0.06, "verify": 0.7, "other": 0.03},
                  rollback={"target": {"method": "crop", "restores": 3, "refed_tokens": 0, "seconds": 0.002}},
                  gamma_policy="constant")
    ar_trace = [Round((), 0, t, False, verify_s=0.3 if i == 0 else 0.05)
                for i, t in enumerate([5, 6, 7, 8, 9, 10, 13])]
    target = result([5, 6, 7, 8, 9, 10, 13], seconds=0.72, trace=ar_trace,
                    phases={"draft": 0.0, "verify": 0.6, "other": 0.07})
    pr = PromptRun("p", [2, 3], greedy=True, settings=Settings(gamma=2).to_dict())
    pr.runs = [StrategyRun("speculative", spec, text="x"), StrategyRun("target", target, text="x")]
    return pr


def match_prompt_run() -> PromptRun:
    """A NASD run of a match drafter (its rounds carry ``note``: where the drafts came from)
    whose draft lengths vary per round, with its prediction known by hand (see the asserts).

    Draft lengths 2, 4, 0, 1 yielding 3, 5, 1, 1 tokens; no draft time; verify by
    width {5: 0.2, 2: 0.06} (the first round, the prefill's 0.5 s, left out) and
    1: target AR's 0.1 s per token; other 0.01 s per round. Priced as measured:
    tokens per round 10/4 = 2.5; seconds per round (0.1 + 0.06 + verify(3) + 0.2) / 4
    + 0.01 with verify(3) = 0.06 + 0.14/3, so 0.35/3 + 0.01. At the mean draft
    length (1.75, so 2: every round verify(3)) it would be 0.32/3 + 0.01.
    """
    trace = [
        Round((5, 6), 2, 7, True, gamma=4, verify_s=0.5, note={"source": "prompt", "match": 4}),
        Round((8, 9, 10, 11), 4, 12, True, gamma=4, verify_s=0.2, note={"source": "prompt", "match": 6}),
        Round((), 0, 13, False, gamma=4, verify_s=0.05, note={"source": "", "match": 0}),
        Round((14,), 0, 15, False, gamma=4, verify_s=0.06, note={"source": "global", "match": 1}),
    ]
    tokens = [5, 6, 7, 8, 9, 10, 11, 12, 13, 15]
    ngram = result(tokens, seconds=0.9, drafted=7, accepted=6, target_calls=4, trace=trace,
                   phases={"draft": 0.0, "verify": 0.81, "other": 0.04}, gamma_policy="constant")
    ar_trace = [Round((), 0, t, False, verify_s=0.3 if i == 0 else 0.1) for i, t in enumerate(tokens)]
    target = result(tokens, seconds=1.2, trace=ar_trace, phases={"draft": 0.0, "verify": 1.2, "other": 0.0})
    pr = PromptRun("p", [2, 3], greedy=True, settings=Settings(gamma=4, ngram_storage="suffix").to_dict())
    pr.runs = [StrategyRun("ngram", ngram, text="x"), StrategyRun("target", target, text="x")]
    return pr


# ------------------------------------------------ infer.py in a child process

ENV = {"target": "t-model (float32)", "drafter": "d-model (float32)", "device": "cpu",
       "versions": {"python": "3.x", "torch": "2.x", "transformers": "5.x"}}


def infer(args, tmp_path, stdin="", timeout=60):
    return subprocess.run([PYTHON, str(INFER), *args], cwd=REPO, env=child_env(tmp_path), input=stdin,
                          capture_output=True, text=True, timeout=timeout)
