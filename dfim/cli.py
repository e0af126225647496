"""The `dfim` command: one entry point, one module per subcommand.

Each subcommand lives next to the code it drives and exposes two functions:
`add_arguments(parser)` and `run(args) -> int`. This file only dispatches, so the engine
never imports the server and adding a command never touches another one's module.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from dfim.commands.options import HelpFormatter

# name -> (module, one-line help). Modules are imported only when their command runs.
COMMANDS: dict[str, tuple[str, str]] = {
    "fill": ("dfim.commands.fill", "print the code that belongs at a position of a file"),
    "serve": ("dfim.commands.serve", "run the language server (stdio by default)"),
    "eval": ("dfim.commands.eval", "fill-in-the-middle evaluation with execution-based pass@1"),
    "tokenizer": ("dfim.commands.tokenizer", "train the BPE tokenizer on a sample of source code"),
    "data": ("dfim.commands.data", "build training token shards from source trees and corpus shards"),
    "train": ("dfim.commands.train", "train or fine-tune a checkpoint (data-parallel under torchrun)"),
    "stats": ("dfim.commands.stats", "acceptance rate and latency from local telemetry"),
    "replay": ("dfim.commands.replay", "replay typing against the real server: acceptance, latency"),
    "bench-realcode": ("dfim.commands.bench_realcode", "FIM problems from a Python project and its tests"),
    "trace": ("dfim.commands.trace", "write an HTML replay of one fill, step by step"),
}


class VersionAction(argparse.Action):
    """`dfim --version`: dfim's version and git commit, torch, the device, threads and CPU: the record
    result files carry (dfim.commands.provenance). Worked out only when asked (git and torch take time)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        from dfim.commands.provenance import version_text

        sys.stdout.write(version_text() + "\n")  # on stdout, as argparse's own version action
        parser.exit()


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The `dfim` parser. Only the module of `command` is imported (its options are the only ones parsed):
    `dfim eval` does not pay for importing torch through `dfim train`'s module, and `dfim --help`, which
    lists the commands' one-line help, imports none."""
    parser = argparse.ArgumentParser(
        prog="dfim", description="Fill code in the middle with a diffusion model."
    )
    parser.add_argument(
        "--version", action=VersionAction, help="print dfim's version and commit, torch, device and CPU"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        command_parser = sub.add_parser(
            name, help=help_text, description=help_text, formatter_class=HelpFormatter
        )
        command_parser.set_defaults(_module=module_name)
        if name != command:
            continue
        try:
            module = importlib.import_module(module_name)
        except ImportError as err:  # a dependency is missing: say which when the command is asked for
            missing = str(err) or type(err).__name__
            command_parser.set_defaults(_missing=missing)
            command_parser.description = f"{help_text} (not available in this install: {missing})"
            continue
        module.add_arguments(command_parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # The first word that is not an option names the command (dfim's own options take no value).
    command = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(command)
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    missing = getattr(args, "_missing", None)
    if missing:
        return not_installed(args.command, missing)
    module = importlib.import_module(args._module)
    try:
        status = int(module.run(args) or 0)
        if not sys.stdout.closed:  # `dfim serve` over stdio: the transport closes it on `exit`
            sys.stdout.flush()
    except ModuleNotFoundError as err:  # a dependency a command imports only when it runs (torch)
        if (err.name or "").partition(".")[0] in OWN_PACKAGES:
            raise
        return not_installed(args.command, str(err))
    except BrokenPipeError:  # the reader of stdout left (`dfim stats | head -1`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 1
    return status


OWN_PACKAGES = {"dfim", "engine", "server"}  # a missing module of these is a bug, not an install problem


def not_installed(command: str, missing: str) -> int:
    print(
        f"dfim: the '{command}' command is not available in this install ({missing}); "
        "reinstall with ./install.sh",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
