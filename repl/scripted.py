"""Scripted mode: run a list of prompts (and commands) without a terminal, then exit.

Sources: ``--prompt TEXT``, ``--prompts-file FILE`` or a non-terminal stdin, as plain lines (``/``
starts a command; ``\n`` escapes) or JSON lines (``prompt``, or Spec-Bench's ``turns``). With
``--json`` each prompt prints one JSON object on stdout. Everything is checked before the models load.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from rich.text import Text

from repl.session import Session, unescape
from utils.text_files import UnreadableText, read_text


class ScriptError(ValueError):
    """A prompts file or stdin line that cannot be used; names the line."""


@dataclass(frozen=True)
class Entry:
    """One scripted step: a prompt to run or a slash command to apply."""

    kind: str  # "prompt" or "command"
    text: str
    where: str  # e.g. "prompts.jsonl:3", for messages


def _json_prompt(line: str, where: str) -> str:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise ScriptError(f"{where}: not valid JSON ({e.msg})") from None
    if isinstance(obj, dict) and isinstance(obj.get("prompt"), str):
        return obj["prompt"]
    turns = obj.get("turns") if isinstance(obj, dict) else None
    if isinstance(turns, list) and turns and isinstance(turns[0], str):
        return turns[0]
    raise ScriptError(f"{where}: a JSON line needs a \"prompt\" string or a \"turns\" list of strings")


def parse_lines(text: str, source: str) -> list[Entry]:
    """Entries from plain or JSON lines; blank lines are skipped."""
    entries = []
    for number, line in enumerate(text.splitlines(), start=1):
        where = f"{source}:{number}"
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("{"):
            entries.append(Entry("prompt", _json_prompt(stripped, where), where))
        elif stripped.startswith("/"):
            entries.append(Entry("command", stripped, where))
        else:
            entries.append(Entry("prompt", unescape(line), where))
    return entries


def read_file(path: str) -> list[Entry]:
    try:
        text = read_text(path)
    except UnreadableText as e:
        raise ScriptError(f"cannot read prompts file {path!r}: {e}") from None
    entries = parse_lines(text, Path(path).name)
    if not entries:
        raise ScriptError(f"prompts file {path!r} holds no prompts")
    return entries


def collect(prompts: list[str] | None, prompts_file: str | None, stdin) -> list[Entry]:
    """The entries to run, from the flags or else from ``stdin``."""
    entries = [Entry("prompt", unescape(p), f"--prompt {i}") for i, p in enumerate(prompts or [], 1)]
    if prompts_file:
        entries += read_file(prompts_file)
    if not prompts and not prompts_file:
        entries = parse_lines(stdin.read(), "stdin")
    return entries


def run_script(session: Session, entries: list[Entry], *, as_json: bool, stdout) -> int:
    """Run every entry; returns 0, or 1 when anything failed along the way."""
    index = 0
    for entry in entries:
        if entry.kind == "command":
            if not session.command(entry.text):
                break
            continue
        failures_before = session.failures
        session.last_error = None
        if as_json:
            session.say(f"[{entry.where}] running…", "dim")
        prompt_run = session.prompt(entry.text)
        if as_json:
            obj = {"index": index, "source": entry.where, "settings": session.settings.to_dict()}
            probe = session.runner.pair.probe
            if probe is not None:
                obj["cache_probe"] = probe.to_dict()
            if prompt_run is None:
                obj.update(prompt=entry.text, error=session.last_error or "not run")
            else:
                obj.update(prompt_run.to_dict())
            stdout.write(json.dumps(obj, ensure_ascii=False) + "\n")
            stdout.flush()
        index += 1
        if prompt_run is not None and prompt_run.interrupted:
            session.console.print(Text("stopped: the remaining prompts were not run", style="yellow"))
            return 130
        if session.failures > failures_before and not as_json:
            session.say(f"[{entry.where}] had errors", "red")
    return 1 if session.failures else 0
