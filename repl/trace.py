"""Trace files: everything a prompt produced, as JSON, and reading it back.

A trace holds the environment and, per prompt, the settings, every strategy's output, rounds,
inspector numbers and metrics; ``infer.py --replay FILE`` renders it again without torch or a model,
which makes it the way to file a bug report. Only :func:`environment` looks at torch.
"""

from __future__ import annotations

import json
import os
import platform
import stat
import tempfile
from dataclasses import dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path

from analysis.divergence import Evidence, row_of
from generation.inspection import Inspection
from generation.result import GenerationResult, Round
from repl.runs import PromptRun, StrategyRun, round_pieces
from repl.settings import STRATEGIES, settings_from_dict
from utils.text_files import UnreadableText, read_text

FORMAT = 2
READS = (2,)
NO_LONGER_READ = (1,)  # the project's own older formats
KIND = "specdec-trace"
# Acceptance numbers under the names older versions wrote; the numbers shown are
# recomputed from the rounds (analysis.acceptance), so only a note says so.
OLD_ACCEPTANCE_NAMES = ("acceptance_by_position", "accepted_length_histogram", "mean_accepted_length")


class TraceError(ValueError):
    """A trace that cannot be written or read; the message is one line."""


# ------------------------------------------------------------------- writing

def environment(pair) -> dict:
    """Models, dtypes, device and library versions of a live session."""
    # Imported here: reading a trace (``infer.py --replay``) must not import torch.
    import sys

    import torch
    import transformers

    def dtype(model) -> str | None:
        value = getattr(model, "dtype", None)
        return None if value is None else str(value).removeprefix("torch.")

    return {
        "target": pair.target_name,
        "drafter": pair.drafter_name,
        "target_dtype": dtype(pair.target),
        "drafter_dtype": dtype(pair.drafter),
        "device": str(pair.device),
        "context_length": pair.context_length,
        "vocab_size": pair.vocab_size,
        "self_draft_demo": pair.self_draft_demo,
        "cache_probe": pair.probe.to_dict() if pair.probe is not None else None,
        "versions": {
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "platform": platform.platform(),
        },
    }


def prompt_record(prompt_run: PromptRun, tokenizer=None) -> dict:
    """One prompt as a trace entry (``tokenizer`` decodes each drafting round's
    pieces; pieces already on a run are kept)."""
    record = {"settings": prompt_run.settings, "prompt_ids": prompt_run.prompt_ids,
              "greedy": prompt_run.greedy, "target_dtype": prompt_run.target_dtype, **prompt_run.to_dict()}
    for run in prompt_run.runs:
        if run.result is None:
            continue
        trace = run.result.trace
        # the debug view and the HTML report show each token's text
        if run.pieces is None and tokenizer is not None and trace:
            run.pieces = round_pieces(tokenizer, prompt_run.prompt_ids, trace)
        result = run.result.to_dict(with_trace=True)
        if run.pieces is not None:
            for rnd, pieces in zip(result.get("trace", []), run.pieces):
                rnd["pieces"] = pieces
        record["strategies"][run.key]["result"] = result
    if tokenizer is not None:
        prompt_run.token_text.update(token_texts(tokenizer, prompt_run, prompt_run.token_text))
    if prompt_run.token_text:
        record["token_text"] = {str(k): v for k, v in sorted(prompt_run.token_text.items())}
    return record


def inspected_ids(prompt_run: PromptRun) -> set[int]:
    """Every token id the inspector names on this prompt (drafts, top tokens, residuals)."""
    ids: set[int] = set()
    for run in prompt_run.runs:
        for rnd in run.result.trace if run.result is not None else []:
            ins = rnd.inspection
            if ins is None:
                continue
            ids.update(rnd.drafted)
            ids.update(t for t, _ in ins.token_top)
            ids.update(t for t, _ in ins.residual or ())
            if rnd.token is not None:
                ids.add(rnd.token)
            for pos in ins.positions:
                ids.update(t for t, _ in pos.p_top)
                ids.update(t for t, _ in pos.q_top)
    return ids


def token_texts(tokenizer, prompt_run: PromptRun, known: dict[int, str]) -> dict[int, str]:
    """The text of each inspected token id not in ``known``, decoded alone (special tokens shown)."""
    return {i: tokenizer.decode([i], skip_special_tokens=False)
            for i in sorted(inspected_ids(prompt_run) - set(known))}


def trace_document(records: list[dict], env: dict) -> dict:
    return {
        "format": FORMAT,
        "kind": KIND,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "environment": env,
        "prompts": records,
    }


def write_trace(path: str, document: dict) -> None:
    """Write ``document`` to ``path`` whole (a temporary file, then a rename)."""
    try:
        text = json.dumps(document, ensure_ascii=False) + "\n"
    except (TypeError, ValueError) as e:
        raise TraceError(f"cannot write trace to {path!r}: {e}") from None
    write_whole(path, text, "trace", ".json")


def write_whole(path: str, text: str, what: str, suffix: str) -> None:
    """Write ``text`` to ``path`` whole: a temporary file beside it, then a rename, so a reader
    never sees half a file; ``what`` names the file in the one-line TraceError on failure."""
    target = _file_target(path, what)
    try:
        handle, tmp = tempfile.mkstemp(prefix=f".{what}-", suffix=suffix, dir=target.parent or ".")
    except OSError as e:
        raise TraceError(f"cannot write {what} to {path!r}: {e.strerror or e}") from None
    try:
        # mkstemp makes the file 0600; give it the mode a plain open would (the existing
        # file's, else 0666 less the umask), so a colleague can read a trace attached to a report.
        os.fchmod(handle, _file_mode(target))
        with os.fdopen(handle, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, target)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise TraceError(f"cannot write {what} to {path!r}: {e.strerror or e}") from None


def _file_target(path: str, what: str) -> Path:
    """``path`` as a Path a file can be written at, as far as its name tells: a directory, a name with a
    NUL byte, or one longer than the file system allows, is a one-line TraceError rather than an error
    from deep inside the write."""
    try:
        target = Path(path).expanduser()
        found = os.stat(target)
    except FileNotFoundError:
        return target
    except (OSError, ValueError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise TraceError(f"cannot write {what} to {path!r}: {reason}") from None
    if stat.S_ISDIR(found.st_mode):
        raise TraceError(f"cannot write {what} to {path!r}: it is a directory")
    return target


def _file_mode(target: Path) -> int:
    """The permission bits a new file at ``target`` gets: those of the file it replaces, else
    0666 less the process's umask."""
    try:
        return target.stat().st_mode & 0o7777
    except OSError:
        return 0o666 & ~_umask()


def _umask() -> int:
    """The process's umask (read from /proc where it can be, else set and restored)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def check_writable(path: str, what: str = "trace") -> None:
    """Raise TraceError unless a ``what`` could be written at ``path``. Nothing is left behind: a file
    that is not there yet is created and removed at once (the one test that holds where the
    permissions say yes and the file system says no: a read-only mount, ``/proc``, root's own)."""
    target = _file_target(path, what)
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.is_dir():
        raise TraceError(f"cannot write {what} to {path!r}: no directory {str(parent)!r}")
    if not os.access(parent, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise TraceError(f"cannot write {what} to {path!r}: permission denied")
    if not target.exists():
        try:
            target.open("x").close()
        except OSError as e:
            raise TraceError(f"cannot write {what} to {path!r}: {e.strerror or e}") from None
        target.unlink(missing_ok=True)


# ------------------------------------------------------------------- reading

@dataclass
class Trace:
    """A trace read back: the environment and the prompts, ready to render."""

    environment: dict
    prompts: list[PromptRun]
    created: str = ""
    format: int = FORMAT
    notes: list[str] = field(default_factory=list)


def _result(data: dict) -> GenerationResult:
    names = {f.name for f in fields(GenerationResult)} - {"trace"}
    values = {k: v for k, v in data.items() if k in names}
    round_names = {f.name for f in fields(Round)}
    trace = []
    for rnd in data.get("trace") or []:
        kept = {k: v for k, v in rnd.items() if k in round_names}
        for name in ("drafted", "tree_tokens", "tree_parents", "path", "ranks"):
            kept[name] = tuple(int(t) for t in kept.get(name, ()))
        if kept.get("inspection") is not None:
            kept["inspection"] = Inspection.from_dict(kept["inspection"])
        trace.append(Round(**kept))
    if values.get("decisions") is not None:               # the rows that decided each token
        values["decisions"] = [row_of(r) for r in values["decisions"]]
    result = GenerationResult(**values, trace=trace)
    result.tokens = [int(t) for t in result.tokens]
    return result


def _strategy(key: str, entry: dict) -> StrategyRun:
    if key not in STRATEGIES:
        raise ValueError(f"unknown strategy {key!r}")
    run = StrategyRun(key, text=str(entry.get("text", "")), error=entry.get("error"),
                      other_load=_load_value(entry.get("other_load")))
    data = entry.get("result")
    reference = (entry.get("divergence") or {}).get("reference")
    if reference is not None:                   # the reference's numbers the verdict was made from
        run.evidence = Evidence.from_dict(reference)
    if data is not None:
        run.result = _result(data)
        pieces = [rnd.get("pieces") for rnd in data.get("trace") or []]
        if pieces and all(isinstance(p, dict) for p in pieces):
            run.pieces = pieces
    return run


def _load_value(value) -> float | None:
    """A recorded other processes' load: a number, or None (old traces have none)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"other_load must be a number, got {value!r}")
    return float(value)


def _machine_load(value) -> dict | None:
    """A prompt's recorded machine load (``utils.machine_load.load_record``), or None."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError("machine_load must be an object")
    return {**value, "other_load": _load_value(value.get("other_load"))}


def _prompt(record: dict) -> PromptRun:
    settings = settings_from_dict(record.get("settings") or {})
    prompt_run = PromptRun(
        prompt=str(record["prompt"]),
        prompt_ids=[int(t) for t in record.get("prompt_ids", [])],
        greedy=bool(record.get("greedy", settings.processor.is_greedy)),
        interrupted=bool(record.get("interrupted", False)),
        settings=settings.to_dict(),
        target_dtype=str(record.get("target_dtype") or ""),
        machine_load=_machine_load(record.get("machine_load")),
    )
    prompt_run.runs = [_strategy(key, entry) for key, entry in record["strategies"].items()]
    prompt_run.token_text = {int(k): str(v) for k, v in (record.get("token_text") or {}).items()}
    step = record.get("plain_step_at_load_s")     # the runner's load-time plain step (None: not timed)
    prompt_run.load_step_s = float(step) if isinstance(step, (int, float)) and not isinstance(step, bool) else None
    samples = record.get("plain_step_at_load_samples_s") or []
    prompt_run.load_step_samples = tuple(float(v) for v in samples if isinstance(v, (int, float))
                                         and not isinstance(v, bool)) if isinstance(samples, list) else ()
    prompt_run.finish()
    return prompt_run


def old_names_note(records: list) -> str | None:
    """One line when the trace names acceptance numbers the old way (None otherwise)."""
    found = [name for name in OLD_ACCEPTANCE_NAMES
             if any(isinstance(entry, dict) and name in entry
                    for record in records if isinstance(record, dict)
                    for entry in (record.get("strategies") or {}).values())]
    if not found:
        return None
    return (f"old acceptance names in this trace ({', '.join(found)}): shown recomputed from its rounds, "
            "under the serving engines' names (docs/why.md)")


def read_trace(path: str) -> Trace:
    """Read a trace file; TraceError (one line) when it cannot be used."""
    try:
        text = read_text(Path(path).expanduser())
    except UnreadableText as e:
        raise TraceError(f"cannot read trace {path!r}: {e}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise TraceError(f"{path}: not a trace file (not valid JSON: {e.msg} at line {e.lineno})") from None
    if not isinstance(data, dict) or data.get("kind") != KIND:
        raise TraceError(f"{path}: not a trace file (no \"kind\": \"{KIND}\")")
    if data.get("format") in NO_LONGER_READ:
        raise TraceError(f"{path}: trace format {data['format']} is no longer read: the trace was written by an "
                         f"older version of this program (this one reads format {FORMAT})")
    if data.get("format") not in READS:
        raise TraceError(f"{path}: trace format {data.get('format')!r} is not one this version reads "
                         f"(it reads formats {', '.join(map(str, READS))})")
    try:
        prompts = [_prompt(record) for record in data["prompts"]]
        env = data.get("environment") or {}
        if not isinstance(env, dict):
            raise TypeError("environment must be an object")
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        detail = f"missing {e}" if isinstance(e, KeyError) else str(e)
        raise TraceError(f"{path}: a damaged trace file ({detail})") from None
    if not prompts:
        raise TraceError(f"{path}: the trace holds no prompts")
    note = old_names_note(data["prompts"])
    return Trace(env, prompts, str(data.get("created", "")), int(data["format"]), [note] if note else [])

