"""The default drafter: the self-drafter this machine runs fastest, measured once and remembered.

With no ``--drafter`` on the offline default model, the loader measures the
target and each self-drafter (``model_drafters.selfdraft.calibrate``), searches the layers
for ``self:skip=auto`` (``model_drafters.selfdraft.search``), and picks the highest predicted
speedup (``model_drafters.selfdraft.choose``). The measurements and the pick are written to
``<cache>/selfdraft/<key>.json``, where the key names this machine (CPU model
and flags, torch threads), the torch and transformers versions, and the model;
a later start reads the file and builds only the pick (``SPECDEC_REMEASURE=1``
measures again).

Timings taken while other processes share the cores can pick the wrong drafter (one machine
chose ``self:fp16`` under load and ``self:int8=weight-only`` quiet). So the CPU other processes
used during the calibration is measured (``utils.machine_load``): above ``BUSY_CORES`` the banner
gets one warning line and the pick is used for this start only, never kept, so the next start
measures again; a kept pick says when it was measured and how loaded the machine was.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import torch
import transformers

from model_drafters.selfdraft import (
    SelfDraftSpec, SkipRefused, build_self_drafter, native_bfloat16, num_layers, parse_self_draft,
)
from model_drafters.selfdraft.calibrate import (Decode, calibration_ids, greedy_continuation, measure_drafter,
                                                paired_step_s)
from generation.timing import time_target
from model_drafters.selfdraft.choose import choice_lines, choose
from model_drafters.selfdraft.search import search_skip
from utils.devices import model_device
from utils.machine_load import LoadReading, busy_warning, cpu_description, load_mark, other_load, read_load

CANDIDATES = ("self:bf16", "self:fp16", "self:int8", "self:skip=auto")
# Measured as well where bfloat16 is native: int8 weights with bfloat16 activations.
NATIVE_BF16_CANDIDATES = ("self:int8=weight-only",)
FORMAT = 4  # 2: weight-only int8 measured where bfloat16 is native; rates by the rule of succession;
#            3: copies draft through their lean step (selfdraft.lean); width 4 timed;
#            4: the other processes' load during the calibration kept (older picks may be a busy one's)
REMEASURE_ENV = "SPECDEC_REMEASURE"  # set to measure again even when this machine has a result


def machine_key(model_label: str, device: torch.device) -> dict:
    """What a measurement depends on: machine, threads, versions, model."""
    name, flags = cpu_description()
    return {"format": FORMAT, "cpu": name, "flags": hashlib.sha1(flags.encode()).hexdigest()[:12],
            "threads": torch.get_num_threads(), "device": str(device), "torch": torch.__version__,
            "transformers": transformers.__version__, "model": model_label}


def cache_file(cache_root: Path, key: dict) -> Path:
    digest = hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_root / "selfdraft" / f"{digest}.json"


def read_cached(path: Path, key: dict) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("key") != key or not data.get("pick") or data.get("busy"):
        return None                       # a busy calibration's pick is never reused
    return data


def write_cached(path: Path, data: dict) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only cache only costs a measurement at the next start


def _candidate(label: str, target, text_ids, start: int, verify_s, say):
    """(resolved label, drafter model, extra banner line) for one candidate label."""
    spec = parse_self_draft(label)
    line = ""
    if spec.auto:
        say("Searching the layers to skip (self:skip=auto)")
        found = search_skip(target, text_ids, start, verify_s)
        spec = SelfDraftSpec("skip", found.layers)
        line = found.line(num_layers(target))
    return spec.label, build_self_drafter(target, spec), line


def candidates_here(device: torch.device) -> tuple[str, ...]:
    """The self-drafters worth measuring on ``device``."""
    native = device.type == "cpu" and native_bfloat16()
    return CANDIDATES + (NATIVE_BF16_CANDIDATES if native else ())


def measure_all(decode: Decode, target, tokenizer, *, gamma: int = 4, say=lambda text: None, candidates=None):
    """Measure every candidate; returns (the cache record, {label: drafter model}).

    Each candidate's draft step is timed in turn with a target step
    (``paired_step_s``), and its run's costs are scaled by the run's own verify
    times to the target's timing taken at the start (``calibrate.load_scale``),
    so a load that changes during the measurement does not favour the
    candidates measured while it was light. A candidate whose step
    costs at least a target step cannot pay (a verify costs at least a step)
    and is not run, unless no candidate is cheaper: then every one is run, so
    that the pick is the one that loses least and the banner's numbers are real.
    """
    started = time.perf_counter()
    candidates = candidates or candidates_here(model_device(target))
    ids = calibration_ids(tokenizer)
    say("Timing the target's forward passes")
    timing = time_target(target, ids)
    step_1 = timing.verify_s[1]
    text_ids = greedy_continuation(decode, target, ids)
    built, measures, notes = [], [], []
    for label in candidates:
        say(f"Timing {label}")
        begun = time.perf_counter()
        try:
            resolved, model, line = _candidate(label, target, text_ids, ids.shape[1], timing.verify_s, say)
        except (SkipRefused, ValueError) as exc:
            measures.append({"label": label, "skipped": str(exc)})
            continue
        if line:
            notes.append(line)
        step, target_step = paired_step_s(model, target, ids)
        built.append((resolved, model, step / target_step, time.perf_counter() - begun))
    run_all = not any(ratio < 1 for *_, ratio, _ in built)
    models = {}
    for resolved, model, ratio, build_s in built:
        if ratio >= 1 and not run_all:
            measures.append({"label": resolved, "draft_step_s": ratio * step_1,
                             "skipped": f"a draft step costs {ratio:.2f} target steps"})
            continue
        say(f"Measuring {resolved}")
        measure = measure_drafter(decode, resolved, model, target, ids, gamma=gamma, reference=timing.verify_s).to_dict()
        measure.update(step_ratio=round(ratio, 4), build_s=build_s)
        measures.append(measure)
        models[resolved] = model
    choice = choose(measures, timing.verify_s, gamma=gamma)
    record = {"target": timing.to_dict(), "candidates": measures, "pick": choice.pick,
              "lines": choice_lines(choice) + notes, "gamma": gamma,
              "measured_s": round(time.perf_counter() - started, 2),
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    return record, models


def load_fields(before: LoadReading, after: LoadReading) -> dict:
    """What the record keeps of the machine's state during the calibration: the cores, the load
    average at its end, the CPU other processes used meanwhile (cores' worth; None where
    unknown) and whether that was busy (``utils.machine_load.is_busy``)."""
    return {"cores": after.cores, "load_average": None if after.loadavg is None else round(after.loadavg[0], 2),
            **load_mark(other_load(before, after))}


def machine_words(record: dict) -> str:
    """``machine quiet (other load 0.1 cores)``, ``machine busy (other load 1.8 of 2 cores)``."""
    load = record.get("other_load")
    if load is None:
        return "other processes' load unknown"
    state = "busy" if record.get("busy") else "quiet"
    return f"machine {state} (other load {load:.1f} of {record.get('cores') or '?'} cores)"


def default_drafter(decode: Decode, target, tokenizer, model_label: str, cache_root: Path, *, gamma: int = 4,
                    say=lambda t: None, reader=None):
    """(drafter model, its label, banner lines): the measured pick, from the cache when this machine has
    one. ``reader``: what takes a load reading (``utils.machine_load.read_load``; tests give fake ones)."""
    reader = reader or read_load
    key = machine_key(model_label, model_device(target))
    path = cache_file(cache_root, key)
    record = None if os.environ.get(REMEASURE_ENV) else read_cached(path, key)
    if record is not None:
        model = build_self_drafter(target, parse_self_draft(record["pick"]))
        return model, record["pick"], record["lines"] + [
            f"(cached choice measured {record['date']}, {machine_words(record)}; kept in {path}: "
            f"set {REMEASURE_ENV}=1 to measure again)"]
    say("Measuring the self-drafters on this machine, once (the result is kept)")
    before = reader()
    record, models = measure_all(decode, target, tokenizer, gamma=gamma, say=say)
    record.update(load_fields(before, reader()), key=key)
    model = models.get(record["pick"]) or build_self_drafter(target, parse_self_draft(record["pick"]))
    warning = busy_warning(record["other_load"], record["cores"], "the self-drafter calibration")
    if warning is not None:
        # Timings taken while other work shares the cores can pick the wrong
        # drafter; such a measurement is used once and never kept.
        return model, record["pick"], record["lines"] + [
            warning, f"(measured in {record['measured_s']:.0f} s; the pick is used for this start only and "
                     "measured again at the next one)"]
    write_cached(path, record)
    return model, record["pick"], record["lines"] + [
        f"(measured in {record['measured_s']:.0f} s, {machine_words(record)}; kept in {path})"]
