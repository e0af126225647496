"""`dfim serve`: run the language server on stdio (default) or TCP.

    dfim serve [--model PATH] [--device cpu|cuda] [--tcp HOST:PORT | --stdio] [--log-file PATH] [-v]
               [--max-message-mb MB] [--client-timeout SECONDS]

stdout carries the protocol, so logs go to stderr (or --log-file). The only socket ever opened is the
listening one that --tcp asks for.
"""

from __future__ import annotations

import argparse
import logging
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        default="",
        help="checkpoint folder, a shipped model's name (default: dfim-base), "
        "or the URL of a `vllm serve` (http://HOST:8000/v1; docs/gpu.md)",
    )
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="where the model runs")
    parser.add_argument(
        "--tcp",
        default="",
        metavar="[HOST:]PORT",
        help="listen on TCP instead of stdio (on 127.0.0.1 unless HOST is given); clients need the token",
    )
    parser.add_argument(
        "--token-file",
        default="",
        metavar="PATH",
        help="with --tcp: write the client's token here (default <data dir>/serve-PORT.token, mode 0600)",
    )
    # vscode-languageclient appends --stdio to a command started with TransportKind.stdio; other clients too
    parser.add_argument(
        "--stdio", action="store_true", help="use stdio (the default; accepted for LSP clients)"
    )
    parser.add_argument("--log-file", default="", help="write logs here instead of stderr")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument(
        "--max-message-mb",
        type=float,
        default=32.0,
        metavar="MB",
        help="largest message read (default 32); a larger one is skipped, and answered with an error",
    )
    parser.add_argument(
        "--client-timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="how long the server waits for the client to answer its own requests (default 30; 0: for ever)",
    )


def parse_address(value: str) -> tuple[str, int]:
    """(host, port) of `--tcp`: loopback when no host is given (`PORT` or `:PORT`); port 0 picks a free one."""
    host, _, port = value.rpartition(":")
    if not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"--tcp wants [HOST:]PORT, got {value!r}")
    return host or "127.0.0.1", int(port)


def run(args: argparse.Namespace) -> int:
    def fail(message: str) -> int:
        print(f"dfim serve: {message}", file=sys.stderr)
        return 2

    if args.tcp and args.stdio:
        return fail("--tcp and --stdio exclude each other")
    if args.token_file and not args.tcp:
        return fail("--token-file goes with --tcp (stdio needs no token)")
    address = None
    if args.tcp:
        try:
            address = parse_address(args.tcp)
        except ValueError as exc:
            return fail(str(exc))
    if not args.max_message_mb > 0:
        return fail(f"--max-message-mb must be positive, got {args.max_message_mb:g}")
    if not args.client_timeout >= 0:
        return fail(f"--client-timeout must be 0 or more, got {args.client_timeout:g}")
    from dfim.engine.model.shipped import is_served_url

    if args.model:
        # A model that is not there is said at once on stderr (an editor's output panel, or the terminal of
        # someone trying the command), but the server still starts: it reports the model to the editor, whose
        # settings can name another without a restart (`model.path`).
        from dfim.commands.checks import InputError, model_folder

        if not is_served_url(args.model):
            try:
                model_folder(args.model)
            except InputError as exc:
                print(
                    f"dfim serve: warning: {exc}; the server starts and reports it to the editor",
                    file=sys.stderr,
                )
    if args.device == "cuda" and not is_served_url(args.model):
        # Likewise a GPU that is not there: said before the editor's first request, which would wait for a
        # load that fails (torch is imported here a second earlier than the server would).
        import torch

        if not torch.cuda.is_available():
            build = f"built for CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
            print(
                f"dfim serve: warning: --device cuda, but PyTorch {torch.__version__} ({build}) sees no CUDA GPU; "
                "the server starts and reports it to the editor (`model.device: cpu` runs on the CPU)",
                file=sys.stderr,
            )
    level = logging.DEBUG if args.verbose else logging.WARNING
    try:
        handler = logging.FileHandler(args.log_file) if args.log_file else logging.StreamHandler(sys.stderr)
    except OSError as exc:
        return fail(f"--log-file {args.log_file}: cannot write ({exc.strerror or exc})")
    logging.basicConfig(
        level=level, handlers=[handler], format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    from dfim.server.app import build_server
    from dfim.server.memory_trace import start_if_asked

    start_if_asked()  # a diagnostic for long soaks, off unless DFIM_TRACE_MEMORY names a file

    ls = build_server(
        model=args.model,
        device=args.device,
        max_message_bytes=int(args.max_message_mb * 1024 * 1024),
        client_timeout=args.client_timeout,
    )
    if address:
        try:
            ls.start_tcp(*address, token_file=args.token_file or None)
        except OSError as exc:  # in use, no permission, unknown host (socket.gaierror is an OSError)
            return fail(f"--tcp: cannot listen on {address[0]}:{address[1]} ({exc.strerror or exc})")
    else:
        ls.start_io()
    return getattr(ls.protocol, "exit_code", 0)  # 1 after `exit` without `shutdown`; 0 when the input closes
