"""The command table: parsing, range checks, help, and flag/slash equivalence."""

from __future__ import annotations

import argparse
import copy

import pytest

from repl.commands import COMMANDS, CommandError, add_flags, apply_flags, completions, execute
from repl.settings import ProcessorSpec, Settings


def run(line: str, settings: Settings | None = None):
    settings = settings or Settings()
    return execute(line, settings), settings


def flags(*argv: str) -> Settings:
    parser = argparse.ArgumentParser()
    add_flags(parser)
    settings = Settings()
    apply_flags(parser.parse_args(list(argv)), settings)
    return settings


def test_defaults_match_the_documented_ones():
    s = Settings()
    assert (s.gamma, s.length, s.processor, s.seed) == (4, 128, ProcessorSpec("greedy"), 42)
    assert (s.ngram_storage, s.ngram_n, s.top_k_filler) == ("basic", 3, 3)
    assert s.reset_in_between and s.cache and s.chat and not s.debug
    assert s.enabled_strategies() == ["speculative", "ngram", "target"]
    assert s.live and s.rtt == 0 and s.rtt_inject == 0


def test_both_round_trips_set_give_a_notice():
    s = Settings(rtt_inject=20.0)
    reply = execute("/rtt 20", s)
    assert reply.ok and reply.message == "rtt: 20 ms" and "already include the injected wait" in reply.notices[0]
    assert execute("/rtt_inject 0", s).notices == ()
    assert not execute("/rtt 5", Settings()).notices


@pytest.mark.parametrize("line, field, value", [
    ("/gamma 6", "gamma", 6),
    ("/gamma 128", "gamma", 128),
    ("/length 1", "length", 1),
    ("/length 512", "length", 512),
    ("/top_k_filler 5", "top_k_filler", 5),
    ("/seed 0", "seed", 0),
    ("/seed 1234", "seed", 1234),
    ("/set_ngramstorage onelevel 4", "ngram_storage", "onelevel"),
    ("/set_ngramstorage ONELEVEL 4", "ngram_n", 4),
    ("/set_ngramstorage basic 2", "ngram_n", 2),
    ("/GAMMA 7", "gamma", 7),
    ("/rtt 20", "rtt", 20.0),
    ("/rtt 0.5", "rtt", 0.5),
    ("/rtt 0", "rtt", 0.0),
    ("/rtt_inject 20", "rtt_inject", 20.0),
])
def test_value_commands_set_their_field(line, field, value):
    reply, s = run(line)
    assert reply.ok, reply.message
    assert getattr(s, field) == value


@pytest.mark.parametrize("line, processor", [
    ("/processor greedy", ProcessorSpec("greedy")),
    ("/processor greedy 0.5", ProcessorSpec("greedy", 0.5)),
    ("/processor multinomial 0.8", ProcessorSpec("multinomial", 0.8)),
    ("/processor topk 0.7 40", ProcessorSpec("topk", 0.7, top_k=40)),
    ("/processor nucleus 0.7 0.9", ProcessorSpec("nucleus", 0.7, top_p=0.9)),
    ("/processor nucleus 1 1", ProcessorSpec("nucleus", 1.0, top_p=1.0)),
    ("/processor topknucleus 0.8 50 0.95", ProcessorSpec("topknucleus", 0.8, 50, 0.95)),
])
def test_processor_forms(line, processor):
    reply, s = run(line)
    assert reply.ok, reply.message
    assert s.processor == processor


@pytest.mark.parametrize("line, expected", [
    ("/gamma abc", "/gamma: N must be a whole number, got 'abc' (usage: /gamma N)"),
    ("/gamma 0", "between 1 and 128, got 0"),
    ("/gamma 129", "between 1 and 128, got 129"),
    ("/gamma", "missing N"),
    ("/gamma 3 4", "expected one N"),
    ("/gamma 2.5", "whole number"),
    ("/length -5", "/length: N must be between 1 and 1000000, got -5"),
    ("/length", "missing N"),
    ("/processor", "missing processor name"),
    ("/processor nucleus 0.7 1.5", "top_p must be in (0, 1], got 1.5"),
    ("/processor nucleus 0.7 0", "top_p must be in (0, 1], got 0.0"),
    ("/processor nucleus 0.7", "nucleus takes TEMPERATURE TOP_P, got 1 values"),
    ("/processor foo", "unknown processor 'foo'"),
    ("/processor nucleas 0.7 0.9", "did you mean nucleus?"),
    ("/processor topk 0.7 0", "top_k must be between 1"),
    ("/processor topk 0.7 abc", "top_k must be a whole number"),
    ("/processor multinomial -1", "temperature must be >= 0"),
    ("/processor multinomial nan", "temperature must be a finite number"),
    ("/processor multinomial hot", "temperature must be a number"),
    ("/processor multinomial 1 2", "multinomial takes TEMPERATURE, got 2 values"),
    ("/set_ngramstorage tree 3", "unknown storage 'tree'; choose basic or onelevel"),
    ("/set_ngramstorage basic 1", "N must be between 2 and 16, got 1"),
    ("/set_ngramstorage basic", "expected a storage kind and N"),
    ("/set_ngramstorage basic x", "N must be a whole number"),
    ("/top_k_filler 0", "between 1 and 1000"),
    ("/seed -1", "between 0 and"),
    ("/seed x", "whole number"),
    ("/speculative maybe", "expected on or off, got 'maybe'"),
    ("/quit now", "/quit: takes no arguments"),
    ("/config x", "takes no arguments"),
    ("/help nosuch", "no command /nosuch"),
    ("/rtt -1", "MS must be between 0 and 10000, got -1"),
    ("/rtt 20000", "MS must be between 0 and 10000"),
    ("/rtt abc", "MS must be a number"),
    ("/rtt nan", "MS must be a finite number"),
    ("/rtt_inject", "missing MS"),
])
def test_bad_arguments_keep_old_settings_and_explain(line, expected):
    before = Settings(gamma=7, length=99, processor=ProcessorSpec("topk", 0.5, top_k=3))
    s = copy.deepcopy(before)
    reply = execute(line, s)
    assert not reply.ok
    assert expected in reply.message
    assert "usage: /" in reply.message
    assert "\n" not in reply.message
    assert s == before


# Arguments nobody means: odd numbers, quoting, control and non-ASCII characters, names the system
# cannot take (an embedded NUL byte), a very long word.
GARBAGE = ["-1", "1e309", "nan", "-inf", "999999999999999999999", "0x10", "1_0", "٣", "²", "'a b'", '"', "\\",
           "\x00", "a\x00b", "é", "on off", "1 2 3 4 5 6", "--help", "/proc/none/x", "a" * 5000, "\t"]


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_no_argument_of_any_command_raises_and_a_refusal_changes_nothing(name):
    """Every command of the table answers garbage with a reply: a refusal is one line and keeps every
    setting; an accepted value gives a setting the table then shows."""
    for garbage in GARBAGE:
        before = Settings(gamma=7, corpus="notes.txt")
        s = copy.deepcopy(before)
        reply = execute(f"/{name} {garbage}", s)
        if not reply.ok:
            assert "\n" not in reply.message and reply.message, (name, garbage, reply.message)
            assert s == before, (name, garbage)


def test_every_error_shows_the_commands_usage():
    reply, _ = run("/processor foo")
    assert reply.message.endswith(f"(usage: {COMMANDS['processor'].usage})")
    reply, _ = run("/set_ngramstorage tree 3")
    assert reply.message.endswith("(usage: /set_ngramstorage basic|onelevel|recycling N | suffix | sam)")


@pytest.mark.parametrize("line, suggestion", [
    ("/gama 3", "/gamma"), ("/lenght 5", "/length"), ("/procesor greedy", "/processor"),
    ("/speculativ", "/speculative"), ("/quti", "/quit"), ("/top_k_filer 2", "/top_k_filler"),
    ("/set_ngram_storage basic 3", "/set_ngramstorage"),
])
def test_unknown_commands_suggest_the_closest(line, suggestion):
    before = Settings()
    reply, s = run(line)
    assert not reply.ok
    assert f"did you mean {suggestion}?" in reply.message
    assert s == before


def test_unknown_command_without_a_close_match():
    reply, _ = run("/xyzzy")
    assert not reply.ok and "unknown command /xyzzy" in reply.message and "did you mean" not in reply.message
    assert "/help" in reply.message


def test_bare_slash_is_an_error():
    assert not execute("/", Settings()).ok


@pytest.mark.parametrize("name", ["speculative", "ngram", "target", "drafter", "cache", "chat",
                                  "debug", "reset_in_between", "live"])
def test_toggles_flip_and_accept_on_off(name):
    s = Settings()
    start = getattr(s, name)
    reply = execute(f"/{name}", s)
    assert reply.ok and getattr(s, name) is (not start)
    assert reply.message == f"{name}: {'on' if not start else 'off'}"
    execute(f"/{name}", s)
    assert getattr(s, name) is start
    for word, value in (("on", True), ("off", False), ("ON", True), ("false", False), ("1", True)):
        assert execute(f"/{name} {word}", s).ok
        assert getattr(s, name) is value


def test_temperature_zero_with_sampling_becomes_greedy_with_a_notice():
    for line in ("/processor multinomial 0", "/processor topk 0 40", "/processor nucleus 0.0 0.9",
                 "/processor topknucleus 0 40 0.9"):
        reply, s = run(line)
        assert reply.ok
        assert s.processor == ProcessorSpec("greedy")
        assert len(reply.notices) == 1 and "using greedy" in reply.notices[0]
        assert reply.message == "processor: greedy"


def test_session_actions_are_reported_not_performed():
    for name in ("config", "clear", "quit", "help"):
        reply, s = run(f"/{name}")
        assert reply.ok and reply.action == name and s == Settings()
    reply, _ = run("/help gamma")
    assert reply.action == "help" and reply.topic == "gamma"
    reply, _ = run("/help /processor")
    assert reply.topic == "processor"


def test_every_command_has_usage_help_and_a_parser():
    for name, command in COMMANDS.items():
        assert command.usage.startswith(f"/{name}")
        assert command.help and "\n" not in command.help
        assert callable(command.parse)


def test_documented_commands_are_all_in_the_table():
    assert set(COMMANDS) == {
        "gamma", "length", "processor", "speculative", "ngram", "target", "drafter", "cache", "chat",
        "debug", "set_ngramstorage", "top_k_filler", "reset_in_between", "seed", "config", "help",
        "clear", "quit", "gamma_policy", "stats", "save", "live", "rtt", "rtt_inject", "tree", "tree_branch", "uag",
        "inspect", "advise", "tree_sample", "verify", "suffix_pattern", "suffix_outputs", "match_factor", "corpus",
        "hybrid", "fill_width", "compile", "whatif",
        "lookahead", "lookahead_window", "lookahead_ngram", "lookahead_guesses",
    } | ({"selftest"} if "selftest" in COMMANDS else set())


def test_confirmation_shows_the_new_value():
    assert run("/gamma 6")[0].message == "gamma: 6"
    assert run("/processor nucleus 0.7 0.9")[0].message == "processor: nucleus(temperature=0.7, top_p=0.9)"
    assert run("/set_ngramstorage onelevel 5")[0].message == "set_ngramstorage: onelevel 5"


# ------------------------------------------------------------- flags

def test_flags_and_slash_commands_write_the_same_settings():
    pairs = [
        (["--gamma", "6"], ["/gamma 6"]),
        (["--length", "64"], ["/length 64"]),
        (["--processor", "nucleus", "0.7", "0.9"], ["/processor nucleus 0.7 0.9"]),
        (["--processor", "topknucleus 0.8 40 0.9"], ["/processor topknucleus 0.8 40 0.9"]),
        (["--processor", "multinomial", "0"], ["/processor multinomial 0"]),
        (["--no-speculative", "--drafter-ar"], ["/speculative off", "/drafter on"]),
        (["--no-target-ar", "--no-ngram"], ["/target", "/ngram"]),
        (["--no-cache", "--no-chat", "--debug"], ["/cache", "/chat", "/debug"]),
        (["--ngram-storage", "onelevel", "4"], ["/set_ngramstorage onelevel 4"]),
        (["--top-k-filler", "7"], ["/top_k_filler 7"]),
        (["--no-reset-in-between"], ["/reset_in_between"]),
        (["--seed", "7"], ["/seed 7"]),
        (["--gamma-policy", "confidence", "0.25"], ["/gamma_policy confidence 0.25"]),
        (["--gamma-policy", "heuristic"], ["/gamma_policy heuristic"]),
        (["--no-live"], ["/live off"]),
        (["--rtt", "20"], ["/rtt 20"]),
        (["--rtt-inject", "12.5"], ["/rtt_inject 12.5"]),
    ]
    for argv, lines in pairs:
        by_slash = Settings()
        for line in lines:
            assert execute(line, by_slash).ok
        assert flags(*argv) == by_slash, argv


def test_no_flags_means_defaults():
    assert flags() == Settings()


@pytest.mark.parametrize("argv, expected", [
    (["--gamma", "abc"], "--gamma: N must be a whole number, got 'abc' (usage: --gamma N)"),
    (["--gamma", "0"], "--gamma: N must be between 1 and 128"),
    (["--length", "-5"], "--length: N must be between 1 and 1000000, got -5"),
    (["--processor", "nucleus", "0.7", "1.5"], "--processor: top_p must be in (0, 1]"),
    (["--processor", "foo"], "--processor: unknown processor 'foo'"),
    (["--ngram-storage", "tree", "3"], "--ngram-storage: unknown storage 'tree'"),
    (["--ngram-storage", "basic", "1"], "--ngram-storage: N must be between 2 and 16"),
    (["--gamma-policy", "confidence", "1"], "--gamma-policy: T must be in (0, 1), got 1.0"),
    (["--gamma-policy", "sometimes"], "--gamma-policy: unknown policy 'sometimes'"),
])
def test_bad_flags_raise_with_the_flag_usage(argv, expected):
    parser = argparse.ArgumentParser()
    add_flags(parser)
    s = Settings()
    with pytest.raises(CommandError) as info:
        apply_flags(parser.parse_args(["--seed", "5", *argv]), s)
    assert expected in str(info.value)
    assert s == Settings()  # nothing applied, not even the good flag


def test_flag_notices_are_returned():
    parser = argparse.ArgumentParser()
    add_flags(parser)
    s = Settings()
    notices = apply_flags(parser.parse_args(["--processor", "topk", "0", "5"]), s)
    assert s.processor.is_greedy and any("greedy" in n for n in notices)


def test_help_text_comes_from_the_table():
    parser = argparse.ArgumentParser()
    add_flags(parser)
    text = parser.format_help()
    for command in COMMANDS.values():
        if command.flag:
            assert f"--{command.flag}" in text
            assert f"[/{command.name};" in text


# -------------------------------------------------------- completion

def test_completion_of_names_and_values():
    assert completions("/ga") == ["/gamma", "/gamma_policy"]
    assert completions("/gamma_policy c") == ["constant", "confidence"]
    assert set(completions("/")) == {f"/{n}" for n in COMMANDS}
    assert completions("/processor ") == ["greedy", "multinomial", "topk", "nucleus", "topknucleus"]
    assert completions("/processor to") == ["topk", "topknucleus"]
    assert completions("/set_ngramstorage o") == ["onelevel"]
    assert completions("/debug o") == ["on", "off"]
    assert completions("/help gam") == ["gamma", "gamma_policy"]
    assert completions("/gamma ") == []
    assert completions("/nosuch x") == []


# -------------------------------------------------------- gamma policy

@pytest.mark.parametrize("line, policy, threshold, shown", [
    ("/gamma_policy constant", "constant", 0.4, "constant"),
    ("/gamma_policy HEURISTIC", "heuristic", 0.4, "heuristic"),
    ("/gamma_policy confidence 0.3", "confidence", 0.3, "confidence 0.3"),
    ("/gamma_policy model", "model", 0.4, "model"),
])
def test_gamma_policy(line, policy, threshold, shown):
    reply, s = run(line)
    assert reply.ok and (s.gamma_policy, s.gamma_threshold) == (policy, threshold)
    assert reply.message == f"gamma_policy: {shown}"


@pytest.mark.parametrize("line, message", [
    ("/gamma_policy", "missing policy name"),
    ("/gamma_policy confidence", "missing threshold T"),
    ("/gamma_policy confidence 0", "T must be in (0, 1), got 0.0"),
    ("/gamma_policy confidence 1.5", "T must be in (0, 1), got 1.5"),
    ("/gamma_policy confidence nan", "T must be a finite number"),
    ("/gamma_policy confidence 0.2 0.3", "expected one threshold T, got 2 words"),
    ("/gamma_policy constant 3", "constant takes no value"),
    ("/gamma_policy heuristc", "unknown policy 'heuristc' (did you mean heuristic?)"),
])
def test_bad_gamma_policy_changes_nothing(line, message):
    s = Settings(gamma_policy="heuristic")
    before = copy.deepcopy(s)
    reply = execute(line, s)
    assert not reply.ok and message in reply.message and "\n" not in reply.message
    assert s == before


def test_default_gamma_policy_is_constant():
    assert (Settings().gamma_policy, Settings().gamma_threshold) == ("constant", 0.4)


def test_stats_and_save_are_actions():
    reply, s = run("/stats")
    assert reply.ok and reply.action == "stats" and s == Settings()
    reply, _ = run("/save my trace.json")
    assert reply.ok and reply.action == "save" and reply.argument == "my trace.json"
    assert not run("/save")[0].ok and not run("/stats now")[0].ok


def test_tree_settings_parse_and_check_their_range():
    reply, settings = run("/tree 16")
    assert reply.ok and settings.tree == 16
    reply, settings = run("/tree_branch 3")
    assert reply.ok and settings.tree_branch == 3
    reply, _ = run("/tree -1")
    assert not reply.ok and "\n" not in reply.message
    reply, _ = run("/tree_branch 0")
    assert not reply.ok
    reply, settings = run("/tree_sample on")
    assert reply.ok and settings.tree_sample is True
    reply, _ = run("/tree_sample maybe")
    assert not reply.ok and "\n" not in reply.message


# -------------------------------------------------------- drafters with another tokenizer

def test_uag_method_is_a_setting_and_a_flag():
    reply, s = run("/uag TLI")
    assert reply.ok and s.uag == "tli" and reply.message == "uag: tli"
    reply, s = run("/uag slm")
    assert not reply.ok and "did you mean slem" in reply.message and s.uag == "slem"
    parser = argparse.ArgumentParser()
    add_flags(parser)
    settings = Settings()
    apply_flags(parser.parse_args(["--uag", "tli"]), settings)
    assert settings.uag == "tli"
    assert completions("/uag ") == ["slem", "tli"]


def test_the_match_storages_take_no_n_and_have_settings_of_their_own(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("some text to match\n", encoding="utf-8")
    reply, s = run("/set_ngramstorage suffix", Settings(ngram_n=5))
    assert reply.ok and s.ngram_storage == "suffix" and s.ngram_n == 5 and reply.message == "set_ngramstorage: suffix"
    reply, s = run("/set_ngramstorage sam 3")
    assert not reply.ok and "sam takes no N" in reply.message and s == Settings()
    s = flags("--ngram-storage", "suffix", "--suffix-pattern", "8", "--suffix-outputs", "0",
              "--match-factor", "2", "--corpus", "notes.txt")
    assert (s.ngram_storage, s.suffix_pattern, s.suffix_outputs, s.match_factor, s.corpus) == (
        "suffix", 8, 0, 2.0, "notes.txt")
    for line in ("/suffix_pattern 0", "/suffix_outputs -1", "/match_factor 0.05", "/match_factor nan"):
        reply, s = run(line)
        assert not reply.ok and s == Settings()
    assert run("/corpus off", Settings(corpus="a.txt"))[1].corpus == ""
    reply, s = run("/corpus notes.txt")
    assert reply.ok and s.corpus == "notes.txt"
    # a file that cannot be read now is refused in one line and the setting stays as it was
    (tmp_path / "binary.bin").write_bytes(b"\xff\xfe\x00 data")
    (tmp_path / "blank.txt").write_text(" \n\n")
    for missing, says in (("absent.txt", "No such file or directory"), (".", "Is a directory"),
                          ("binary.bin", "'utf-8' codec can't decode"), ("blank.txt", "holds no text")):
        reply, s = run(f"/corpus {missing}", Settings(corpus="notes.txt"))
        assert not reply.ok and f"corpus file '{missing}'" in reply.message and says in reply.message
        assert "\n" not in reply.message and s.corpus == "notes.txt"
    with pytest.raises(CommandError, match="cannot read corpus file 'absent.txt'"):
        flags("--corpus", "absent.txt")


def test_hybrid_takes_a_match_length_from_0_to_64():
    reply, s = run("/hybrid 4")
    assert reply.ok and s.hybrid == 4 and reply.message == "hybrid: 4"
    assert run("/hybrid 0", Settings(hybrid=4))[1].hybrid == 0
    for line in ("/hybrid -1", "/hybrid 65", "/hybrid on", "/hybrid"):
        reply, s = run(line)
        assert not reply.ok and "\n" not in reply.message and s == Settings()
    assert flags("--hybrid", "8").hybrid == 8
    assert COMMANDS["hybrid"].show(Settings()) == "off" and COMMANDS["hybrid"].show(Settings(hybrid=3)) == "3"
