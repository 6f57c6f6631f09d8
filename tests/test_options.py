"""One settings path: the facts about options live below both front ends, each in one place.

The REPL's command table and the benchmark's flags read the same ranges, names and processor
grammar (``utils.options``, ``sampling.spec``); the ranges end where the engine refuses; the
benchmark parses its flags into a frozen value of its own and reads nothing of the REPL.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
from pathlib import Path

import pytest

from utils import options

ROOT = Path(__file__).resolve().parent.parent


def _imported_modules(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module)
    return out


def test_no_module_of_the_benchmark_imports_the_repl():
    reads = {path.name: sorted(m for m in _imported_modules(path) if m.split(".")[0] == "repl")
             for path in (ROOT / "bench").rglob("*.py")}
    assert {name: mods for name, mods in reads.items() if mods} == {}


def test_the_scan_sees_an_import_of_the_repl_inside_a_function(tmp_path):
    """Mutation check: the scan above would catch a function-level import."""
    path = tmp_path / "mod.py"
    path.write_text("def f():\n    from repl.commands import GAMMA_RANGE\n    return GAMMA_RANGE\n")
    assert "repl.commands" in _imported_modules(path)


def test_the_ranges_end_where_the_engine_refuses():
    import engine
    from generation.common import check_gamma

    assert options.GAMMA_RANGE[1] == engine.MAX_GAMMA
    assert options.HYBRID_RANGE[1] == engine.MAX_HYBRID_MATCH
    assert check_gamma(engine.MAX_GAMMA) == engine.MAX_GAMMA
    with pytest.raises(ValueError, match=f"at most {engine.MAX_GAMMA}"):
        check_gamma(engine.MAX_GAMMA + 1)
    engine.HybridOptions(engine.MAX_HYBRID_MATCH)
    with pytest.raises(ValueError):
        engine.HybridOptions(engine.MAX_HYBRID_MATCH + 1)


def test_the_storage_names_are_the_engines_storages():
    from engine.state import STORAGE_CLASSES

    assert tuple(STORAGE_CLASSES) == options.NGRAM_STORAGES
    assert set(options.MATCH_STORAGES) <= set(options.NGRAM_STORAGES)


def test_both_front_ends_read_the_same_facts():
    import repl.commands as commands
    import repl.settings as settings

    for name in ("GAMMA_RANGE", "NGRAM_N_RANGE", "SUFFIX_PATTERN_RANGE", "HYBRID_RANGE", "LOOKAHEAD_WINDOW_RANGE",
                 "LOOKAHEAD_NGRAM_RANGE", "LOOKAHEAD_GUESSES_RANGE", "NGRAM_STORAGES", "MATCH_STORAGES"):
        assert getattr(commands, name) is getattr(options, name)
    for name in ("NGRAM_STORAGES", "MATCH_STORAGES", "GAMMA_POLICIES", "UAG_METHODS"):
        assert not hasattr(settings, name)          # read from utils.options, never copied
    assert commands.CommandError is options.OptionError


@pytest.mark.parametrize("text", ["beam 4", "nucleus x", "greedy 1 2", "", "nucleus 0.7 1.5", "topk 1 0",
                                  "multinomial -1", "multinomial inf", "nucleous 0.7 0.9"])
def test_the_processor_grammar_says_the_same_on_both_front_ends(text):
    """The REPL's /processor and the benchmark's --processor reject alike, with one message."""
    from bench.processors import parse_processor
    from repl.commands import parse_processor as repl_parse

    with pytest.raises(options.OptionError) as bench_error:
        parse_processor(text)
    with pytest.raises(options.OptionError) as repl_error:
        repl_parse(text.split())
    assert str(bench_error.value) == str(repl_error.value)
    assert "\n" not in str(bench_error.value)


def test_the_processor_grammar_accepts_alike():
    from bench.processors import parse_processor
    from repl.commands import parse_processor as repl_parse

    for text in ("greedy", "greedy 0.5", "multinomial 0", "topk 0.7 5", "nucleus 0.7 0.9", "topknucleus 1 5 0.9"):
        assert parse_processor(text) == repl_parse(text.split()).changes["processor"]
    assert repl_parse(["multinomial", "0"]).notices  # the REPL says why it became greedy


def test_the_benchmark_settings_are_a_frozen_value_with_a_field_per_flag():
    from bench.cli import build_parser, parse_settings
    from bench.settings import BenchSettings

    settings = parse_settings(["--gamma", "4", "--strategies", "target,drafter"])
    assert isinstance(settings, BenchSettings)
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.strategies = ["target"]  # type: ignore[misc]
    later = settings.but(strategies=["target"])
    assert (settings.strategies, later.strategies, later.gamma) == (["target", "drafter"], ["target"], [4])
    dests = {a.dest for a in build_parser()._actions if a.dest != "help"}
    assert dests == {f.name for f in dataclasses.fields(BenchSettings)}
    with pytest.raises(TypeError, match="without a BenchSettings field"):
        BenchSettings.from_namespace(argparse.Namespace(**vars(build_parser().parse_args([])), stray=1))


def test_the_benchmark_flags_take_the_ranges_of_the_repl(capsys):
    from bench.cli import build_parser

    parser = build_parser()
    for flag, (low, high) in (("--ngram-n", options.NGRAM_N_RANGE), ("--suffix-pattern", options.SUFFIX_PATTERN_RANGE)):
        assert getattr(parser.parse_args([flag, str(high)]), flag[2:].replace("-", "_")) == high
        for bad in (low - 1, high + 1):
            with pytest.raises(SystemExit):
                parser.parse_args([flag, str(bad)])
        assert f"expected an integer from {low} to {high}" in capsys.readouterr().err
    assert parser.parse_args(["--gamma", str(options.GAMMA_RANGE[1])]).gamma == [options.GAMMA_RANGE[1]]
    with pytest.raises(SystemExit):
        parser.parse_args(["--gamma", f"4,{options.GAMMA_RANGE[1] + 1}"])
    assert f"a gamma is at most {options.GAMMA_RANGE[1]}" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parser.parse_args(["--uag", "nope"])
    assert "choose from 'slem', 'tli'" in capsys.readouterr().err


def test_each_limit_is_defined_once():
    """MAX_GAMMA and MAX_HYBRID_MATCH are assigned in utils/options.py only (a second definition could
    drift from the ranges); the option names likewise."""
    names = {"MAX_GAMMA", "MAX_HYBRID_MATCH", "NGRAM_STORAGES", "MATCH_STORAGES", "GAMMA_POLICIES", "UAG_METHODS"}
    where = {}
    for path in ROOT.rglob("*.py"):
        if any(part in (".venv", "tests") or part.startswith(".") for part in path.relative_to(ROOT).parts):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AnnAssign):
                targets = [node.target]
            else:
                continue
            for target in targets:
                if isinstance(target, ast.Name) and target.id in names:
                    where.setdefault(target.id, []).append(str(path.relative_to(ROOT)))
    assert where == {name: ["utils/options.py"] for name in names}
