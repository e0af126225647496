"""The options every command shares (dfim/commands/options.py): one spelling, defaults shown in --help, bad
values refused with the valid ones, --max-tokens beyond the cap refused with the cap."""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path

import pytest

from dfim.cli import COMMANDS, build_parser, main
from dfim.commands import options

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "fixtures" / "example.py"
EVAL_FIXTURE = ROOT / "fixtures" / "eval" / "tiny-infilling.jsonl"
REALCODE = ROOT / "fixtures" / "realcode" / "problems.jsonl"

# The commands that sample (a seed changes their output), with the arguments that make a parse complete.
SAMPLING = {
    "fill": [str(EXAMPLE), "--line", "1", "--col", "1"],
    "trace": [str(EXAMPLE), "--line", "1", "--col", "1"],
    "eval": [str(EVAL_FIXTURE)],
    "replay": [str(EXAMPLE)],
    "bench-realcode": ["score", str(REALCODE)],
}
# Commands whose modules this branch owns (`dfim serve`'s options belong to the server's owner).
OWNED = [name for name in COMMANDS if name != "serve"]


def command_parsers(name: str) -> list[argparse.ArgumentParser]:
    """The parser of `dfim NAME`, and its action parsers (bench-realcode build, score)."""
    parser = build_parser(name)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    found, todo = [], [sub.choices[name]]
    while todo:
        p = todo.pop()
        found.append(p)
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                todo.extend(action.choices.values())
    return found


def refused(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(list(argv))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


@pytest.mark.parametrize("name", OWNED)
def test_every_option_has_help_and_shows_its_default(name):
    for parser in command_parsers(name):
        assert isinstance(parser.formatter_class, type) and issubclass(
            parser.formatter_class, options.HelpFormatter
        ), parser.prog
        text = parser.format_help()
        for action in parser._actions:
            if not action.option_strings or action.dest == "help":
                continue
            assert action.help, f"{parser.prog} {action.option_strings[0]}: no help text"
            shown = options.HelpFormatter(parser.prog)._get_help_string(action)
            if action.default not in (None, False, [], "") and action.default is not argparse.SUPPRESS:
                assert "default" in shown.lower(), (
                    f"{parser.prog} {action.option_strings[0]}: default not shown"
                )
        assert "(default: 0)" in text or name not in SAMPLING or "seed" not in text


@pytest.mark.parametrize("name", list(SAMPLING))
def test_every_sampling_command_takes_a_seed_with_its_default_shown(name):
    parsers = command_parsers(name)
    seeds = [a for p in parsers for a in p._actions if "--seed" in a.option_strings]
    assert seeds, f"dfim {name} has no --seed"
    assert all(a.default == 0 and a.type is int for a in seeds)
    args = build_parser(name).parse_args([name, *SAMPLING[name], "--seed", "7"])
    assert args.seed == 7


@pytest.mark.parametrize("name", ["fill", "trace", "eval", "replay", "bench-realcode", "train"])
def test_device_is_a_choice_everywhere(capsys, name):
    argv = [name, *SAMPLING.get(name, ["--data", "d", "--out", "o"]), "--device", "gpu"]
    err = refused(capsys, *argv)
    assert "--device" in err and "'gpu'" in err and "cpu, cuda, cuda:N" in err
    for good in ("cpu", "cuda", "cuda:1"):  # accepted by the parser (CUDA's presence is the engine's check)
        args = build_parser(name).parse_args([*argv[:-1], good])
        assert args.device == good


def test_a_language_outside_the_list_is_refused_with_the_list(capsys):
    err = refused(capsys, "fill", str(EXAMPLE), "--line", "1", "--col", "1", "--language", "cobol")
    assert "'cobol'" in err
    for name in ("python", "javascript", "rust", "go", "cpp"):
        assert name in err
    args = build_parser("fill").parse_args(["fill", "x", "--line", "1", "--col", "1", "--language", "Py"])
    assert args.language == "python"  # aliases and case as the server reads languageIds


@pytest.mark.parametrize(
    "argv",
    [
        ["fill", str(EXAMPLE), "--line", "1", "--col", "1"],
        ["trace", str(EXAMPLE), "--line", "1", "--col", "1"],
        ["eval", str(EVAL_FIXTURE)],
        ["bench-realcode", "score", str(REALCODE), "--reference"],
    ],
)
def test_max_tokens_beyond_the_cap_is_refused_with_the_cap(capsys, argv, tmp_path):
    code = main(
        [*argv, "--max-tokens", "100000", *(["--out", str(tmp_path / "o")] if "eval" in argv else [])]
    )
    err = capsys.readouterr().err
    assert code == 2
    line = err.strip().splitlines()[-1]
    assert "--max-tokens" in line and str(options.MAX_TOKENS_CAP) in line and "100000" in line
    assert not (tmp_path / "o").exists()


def test_the_cap_is_the_engines_largest_canvas():
    from dfim.engine.inference.canvas import BUCKETS

    assert options.MAX_TOKENS_CAP == BUCKETS[-1]
    options.check_max_tokens(options.MAX_TOKENS_CAP)  # the cap itself is fine
    options.check_max_tokens(None)


def test_realcode_score_defaults_to_the_shipped_model():
    args = build_parser("bench-realcode").parse_args(["bench-realcode", "score", str(REALCODE)])
    assert args.model is None and not args.reference and args.completions is None
    args = build_parser("bench-realcode").parse_args(
        ["bench-realcode", "score", str(REALCODE), "--model", "default"]
    )
    assert args.model == "default"  # the old spelling still works


def test_help_formatter_adds_a_default_only_where_there_is_one():
    parser = argparse.ArgumentParser(formatter_class=options.HelpFormatter)
    parser.add_argument("--a", type=int, default=3, help="three")
    parser.add_argument("--b", default=None, help="none")
    parser.add_argument("--c", action="store_true", help="flag")
    parser.add_argument("--d", default=5, help="five (default: five)")
    parser.add_argument("--e", type=int, default=0, help="zero")
    text = " ".join(parser.format_help().split())
    assert "three (default: 3)" in text and "zero (default: 0)" in text
    assert "none (default" not in text and "flag (default" not in text
    assert text.count("default") == 3  # (d says its own, once)


def test_modules_import_without_torch_for_help():
    """The shared options read no torch: `dfim eval --help` stays fast."""
    import subprocess
    import sys

    code = "import sys, dfim.commands.options, dfim.cli; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
    importlib.import_module("dfim.commands.options")


def test_the_command_list_imports_no_command(capsys):
    """`dfim --help` lists the commands from their one-line help: importing them all (torch through `dfim
    train`) made it take seconds."""
    import subprocess
    import sys

    code = (
        "import sys\nfrom dfim.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print('torch' in sys.modules, 'dfim.commands.train' in sys.modules, file=sys.stderr)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "fill" in proc.stdout and "bench-realcode" in proc.stdout
    assert proc.stderr.strip() == "False False", proc.stderr
