"""The header of every benchmark report: when, where, with what."""

from __future__ import annotations

import datetime as _dt
import os
import platform
from importlib.metadata import PackageNotFoundError, version

import torch
import transformers

from bench.margin import expectation_level
from utils.defaults import differences
from utils.devices import HALF_DTYPES, half_precision_reason


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, or what platform knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _dtype(model) -> str:
    try:
        return str(next(model.parameters()).dtype).replace("torch.", "")
    except (StopIteration, AttributeError):
        return "?"


def _version(module: str) -> str | None:
    try:
        return version(module)
    except PackageNotFoundError:
        return None


def environment(models) -> dict:
    """Machine, library versions, models and their dtypes."""
    device = str(models.device)
    info = {
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "device": device,
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        # With scikit-learn installed, transformers' dynamic assisted generation also
        # retunes its confidence threshold during a call; without it the threshold stays.
        "scikit_learn": _version("scikit-learn"),
        "platform": platform.platform(),
        "target": models.target_name,
        "drafter": models.drafter_name,
        "target_dtype": _dtype(models.target),
        "drafter_dtype": _dtype(models.drafter),
        "self_draft_demo": models.self_draft_demo,
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return info


def _named(name: str, dtype: str) -> str:
    """A model's name with its dtype, unless the name already says it."""
    return name if dtype in str(name) else f"{name} ({dtype})"


def _until_text(settings: dict) -> str:
    """`` (until decided, at most 12; expectations at 99.44% a look)`` when --until-decided chose
    how many repeats ran (each look's level: ``bench.margin.expectation_level``)."""
    most = settings.get("until_decided")
    if not most:
        return ""
    level = expectation_level(settings.get("planned_repeats", settings["repeats"]), most)
    return f" (until decided, at most {most}; expectations at {level:.2%} a look)"


def header_lines(env: dict, settings: dict) -> list[str]:
    """Two or three short lines for the top of the table."""
    lines = [
        f"{env['date']} · {env['device']} ({env['cpu']}, {env['torch_threads']} torch threads"
        + (f", {env['gpu']}" if env.get("gpu") else "") + ")"
        + f" · torch {env['torch']} · transformers {env['transformers']}",
        f"target {_named(env['target'], env['target_dtype'])} · drafter "
        f"{_named(env['drafter'], env['drafter_dtype'])}",
        f"{settings['processor']} · {settings['length']} new tokens · {settings['prompt_count']} "
        f"prompts ({settings['prompts']}) · {settings['repeats']} repeats{_until_text(settings)} · warm-up "
        f"{settings['warmup']} · seed {settings['seed']} · chat template "
        f"{'on' if settings['chat'] else 'off'} · n-gram {settings['ngram_storage']} "
        f"n={settings['ngram_n']}" + (f" P={settings['suffix_pattern']}" if "suffix" in settings['ngram_storage']
                                       and settings.get("suffix_pattern", 16) != 16 else "") + _session_text(settings)
        + (f" · compile {settings['compile']}" if settings.get("compile") else ""),
    ]
    if settings["processor"] == "greedy" and env.get("target_dtype") in HALF_DTYPES:
        lines.append(f"note: {half_precision_reason(env['target_dtype'])}")   # docs/benchmark.md
    if (line := defaults_line(settings)) is not None:
        lines.append(line)
    return lines


def defaults_line(settings: dict) -> str | None:
    """``differs from the REPL's defaults: seed 0, verify residual`` naming every shared setting
    (``utils.defaults``) this run changed; None when it changed none. A list setting (``verify``,
    ``ngram_storage``) reads as its items joined by commas."""
    values = {name: ",".join(map(str, value)) if isinstance(value, list) else value
              for name, value in settings.items()}
    changed = differences(values)
    return "differs from the REPL's defaults: " + ", ".join(changed) if changed else None


def _session_text(settings: dict) -> str:
    """`` · multi-turn, 3 conversations`` or `` · sessions of 4 prompts (2)``; "" without sessions."""
    if settings.get("multi_turn"):
        return f" · multi-turn, {settings.get('sessions')} conversations"
    if settings.get("session_size"):
        return f" · sessions of {settings['session_size']} prompts ({settings.get('sessions')})"
    return ""
