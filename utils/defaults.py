"""The decoding defaults the REPL and the benchmark share, in one place: ``repl.settings.Settings``,
the benchmark's flags and ``bench.executor.RunSettings`` take them, so either front end without
flags decodes alike. Torch-free."""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class Defaults:
    """What a prompt run decodes with when nothing says otherwise."""

    gamma: int = 4                 # draft tokens per round (the benchmark sweeps γ: --gamma 2,4,8)
    length: int = 128              # new tokens per prompt
    seed: int = 42                 # the same for every strategy
    verify: str = "block"          # the chain verify rule (generation.verify_names)
    top_k_filler: int = 3          # NASD: the target's top-k predictions also stored
    tree_branch: int = 2           # children per expanded tree node
    tree_sample: bool = True       # under sampling: tree children drawn from q, recursive rejection sampling
    ngram_storage: str = "basic"   # NASD's storage
    ngram_n: int = 3               # the n-gram order
    suffix_pattern: int = 16       # the suffix storage's longest matched tail P
    uag: str = "slem"              # a drafter with another tokenizer: slem or tli
    chat: bool = True              # the tokenizer's chat template on
    processor: str = "greedy"      # the processor's command text (sampling.spec.ProcessorSpec.command_text)


DEFAULTS = Defaults()


def differences(values: dict) -> list[str]:
    """``name value`` for each of ``values`` (a default's name -> the value a run used) that is
    not :data:`DEFAULTS`' own, in the order of the dataclass; names it lacks are skipped."""
    out = []
    for f in fields(Defaults):
        if f.name in values and values[f.name] != getattr(DEFAULTS, f.name):
            out.append(f"{f.name} {_text(values[f.name])}")
    return out


def _text(value) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)
