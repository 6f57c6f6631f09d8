"""Run every enabled strategy on one prompt, the same way each time.

The runner owns the model pair, the n-gram storage and the warm-up. It never prints: each finished
strategy goes to a callback, so printing is outside every timer, and it returns a
:class:`repl.runs.PromptRun`.
"""

from __future__ import annotations

import gc
from contextlib import nullcontext
from typing import Callable, ContextManager

import torch

from analysis.report import gamma_cap
from engine import CrossTokenizerOptions, EngineState, NGramOptions, Observer, Strategy, decodes_alone, run_strategy
from engine.named import named_strategy
from generation import GenerationResult, StrategyRefused
from repl.runs import PromptRun, StrategyRun
from repl.settings import Settings
from utils.errors import is_out_of_memory
from utils.machine_load import load_record, other_load, read_load
from utils.method_name import MethodName
from utils.vocab import encode_prompt, has_chat_template

WARMUP_TEXT = "Hello, how are you?"


class PromptRefused(ValueError):
    """The prompt cannot run as asked (empty, or too long for the context)."""


def free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class Runner:
    """Runs prompts on a loaded model pair (a ``utils.models.ModelPair``)."""

    def __init__(self, pair, notify: Callable[[str], None] = lambda message: None):
        self.pair = pair
        self.notify = notify
        self.state = EngineState()  # the n-gram storage and the gamma policies, kept across prompts
        self.load_step_s: float | None = None   # the target's one-token step, timed by warm_up
        self.load_step_samples: tuple[float, ...] = ()   # the turns it was timed over (their spread)
        self._told_no_template = False
        self._told_fallbacks: set[str] = set()   # the compile fallbacks already told (each once)

    # ------------------------------------------------------------ prompt -> ids

    def encode(self, text: str, settings: Settings) -> list[int]:
        """Token ids for ``text``, through the chat template when chat is on."""
        tokenizer = self.pair.tokenizer
        if settings.chat and not has_chat_template(tokenizer) and not self._told_no_template:
            self._told_no_template = True
            self.notify("this tokenizer has no chat template: prompts are used as raw text")
        return encode_prompt(tokenizer, text, chat=settings.chat)

    def check_fits(self, ids: list[int], settings: Settings) -> None:
        """Raise PromptRefused when the prompt and the length budget do not fit."""
        if not ids:
            raise PromptRefused("the prompt encodes to no tokens")
        limit = self.pair.context_length
        if limit is not None and len(ids) + settings.length > limit:
            raise PromptRefused(
                f"prompt refused: {len(ids)} prompt tokens + {settings.length} new tokens = "
                f"{len(ids) + settings.length}, more than the context of {limit} tokens "
                f"(at most {max(limit - len(ids), 0)} new tokens fit; lower /length)"
            )

    # ------------------------------------------------------------------ running

    def warm_up(self, compile: str = "off") -> None:
        """One short run per model and one speculative run, so the first timed strategy does not pay for
        lazy initialisation, on the session's ``compile`` path; then :meth:`time_plain_step`."""
        settings = Settings(length=4, gamma=2, chat=False, compile=compile)
        ids = self.pair.tokenizer(WARMUP_TEXT).input_ids or [0]
        for key in ("target", "drafter", "speculative"):
            if key == "drafter" and not decodes_alone(self.pair.drafter):
                continue                     # MTP layers, an EAGLE-3 head, a Gemma 4 assistant: they draft from the target
            self._generate(key, ids, settings, interruptible=False)
        self.load_step_s = self.time_plain_step()

    def time_plain_step(self) -> float | None:
        """Seconds of one target forward over one new token (``engine.widths.plain_step_timing``): the
        plain step a prompt's predictions take when target AR does not run (docs/why.md); None for a
        served target."""
        from engine.widths import fill_refusal, plain_step_timing

        if fill_refusal(self.pair.target) is not None:
            return None
        try:
            step, self.load_step_samples = plain_step_timing(self.pair, self.state, self.pair.vocab_size)
            return step
        except Exception as e:  # a failed timing must not end the session: the runs price it themselves
            self.notify(f"could not time the target's step at load ({type(e).__name__}: {e}); "
                        "with target AR off, predictions read it off each run's own rounds")
            return None

    def _generate(self, key: str, ids: list[int], settings: Settings, *,
                  interruptible: bool = True, observer: Observer | None = None) -> GenerationResult:
        return run_strategy(strategy_for(key, settings), self.pair, ids, state=self.state,
                            interruptible=interruptible, observer=observer)

    def run_strategy(self, key: str, ids: list[int], settings: Settings,
                     observer: Observer | None = None) -> StrategyRun:
        """One strategy, with its failures turned into an error line."""
        run = StrategyRun(key)
        try:
            run.result = self._generate(key, ids, settings, observer=observer)
        except StrategyRefused as e:       # the context, or a setting this pair cannot take
            run.error = f"refused: {e}"
        except Exception as e:  # a failing strategy must not end the session
            if is_out_of_memory(e):
                free_memory()
                run.error = (f"out of memory on {self.pair.device}: "
                             "lower /length or /gamma, or use a smaller model")
            else:
                run.error = f"failed: {type(e).__name__}: {e}"
        else:
            run.text = self.output_tokenizer(key).decode(run.result.tokens, skip_special_tokens=True)
            self.tell_fallback(run.result)
        return run

    def tell_fallback(self, result: GenerationResult) -> None:
        """Notify once per session each reason a run's compile path fell back (the panels say
        which path ran; the reason is told the first time only)."""
        compiled = result.compile
        reason = (compiled or {}).get("reason") or ""
        if reason and reason not in self._told_fallbacks:
            self._told_fallbacks.add(reason)
            self.notify(f"compile {compiled['requested']} fell back to {compiled['path']}: {reason}")

    def output_tokenizer(self, key: str):
        """The tokenizer of strategy ``key``'s output ids: the drafter's own for drafter AR
        when its tokenizer differs from the target's (the engine runs it on its own ids)."""
        return self.pair.drafter_tok if key == "drafter" else self.pair.tokenizer

    def prepare(self, text: str, settings: Settings) -> PromptRun:
        """Encode ``text`` and check it fits; raises PromptRefused otherwise."""
        ids = self.encode(text, settings)
        self.check_fits(ids, settings)
        dtype = None if self.pair.target is None else self.pair.target.dtype
        return PromptRun(text, ids, greedy=settings.processor.is_greedy, settings=settings.to_dict(),
                         target_dtype="" if dtype is None else str(dtype).removeprefix("torch."),
                         load_step_s=self.load_step_s, load_step_samples=self.load_step_samples)

    def run(self, prompt_run: PromptRun, settings: Settings,
            on_run: Callable[[PromptRun, StrategyRun], None] = lambda prompt_run, run: None,
            watch: Callable[[str], ContextManager] | None = None) -> PromptRun:
        """Run each enabled strategy in order on a prepared prompt.

        A Ctrl-C ends the current strategy (its partial output kept, marked interrupted) and skips the
        rest. ``watch(key)`` gives a strategy's observer (the live view). Machine-load readings around each
        strategy and the whole prompt go into the figures; each run's report is computed at the end.
        """
        start = read_load()
        try:
            for key in settings.enabled_strategies():
                before = read_load()
                with watch(key) if watch is not None else nullcontext() as observer:
                    run = self.run_strategy(key, prompt_run.prompt_ids, settings, observer)
                run.other_load = other_load(before, read_load())
                prompt_run.runs.append(run)
                on_run(prompt_run, run)
                if run.result is not None and run.result.interrupted:
                    prompt_run.interrupted = True
                    break
        except KeyboardInterrupt:
            prompt_run.interrupted = True
        prompt_run.machine_load = load_record(start, read_load())
        prompt_run.finish(self.reference(prompt_run.prompt_ids))
        return prompt_run

    def reference(self, prompt_ids: list[int]):
        """What a difference from target AR on ``prompt_ids`` is judged against: the target's own
        uncached forward (``analysis.reference``); None for a served or encoder-decoder target."""
        from analysis.reference import referee_for

        referee = referee_for(self.pair.target)
        return None if referee is None else referee.for_prompt(prompt_ids)


def strategy_for(key: str, settings: Settings) -> Strategy:
    """The engine strategy ``key`` under ``settings``: the model policy chooses among 0..max(/gamma, 16)
    drafts; /uag, /hybrid and lookahead's W, N, G map to their options (``engine.strategy``)."""
    policy = settings.gamma_policy
    shape = f"{settings.lookahead_window},{settings.lookahead_ngram},{settings.lookahead_guesses}"
    method = MethodName(key, gamma_cap(settings.gamma, policy), policy, settings.tree, verify=settings.verify,
                        hybrid=settings.hybrid, shape=shape if key == "lookahead" else "")
    storage = NGramOptions(settings.ngram_storage, settings.ngram_n, settings.top_k_filler,
                           reset=settings.reset_in_between, max_pattern=settings.suffix_pattern,
                           factor=settings.match_factor, max_outputs=settings.suffix_outputs,
                           corpus=settings.corpus or None, fill_width=settings.fill_width)
    return named_strategy(method, ngram=storage, cross=CrossTokenizerOptions(settings.uag),
                          fresh=settings.reset_in_between, key=key, tree_branch=settings.tree_branch,
                          tree_sample=settings.tree_sample,
                          gamma_threshold=settings.gamma_threshold if policy == "confidence" else None,
                          processor=settings.processor, use_cache=settings.cache, max_gen_len=settings.length,
                          seed=settings.seed, target_delay_s=settings.rtt_inject / 1000.0, compile=settings.compile)
