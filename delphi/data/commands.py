"""`delphi data prepare`: build a token store from a corpus source."""

from __future__ import annotations

import argparse
import sys


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    from delphi.cli import add_json_flag

    data = subparsers.add_parser("data", help="corpus sources and token stores")
    data_sub = data.add_subparsers(dest="data_command", metavar="SUBCOMMAND")
    prepare = data_sub.add_parser(
        "prepare",
        help="build train.bin/val.bin/meta.json from a source",
        description="Build a byte-level token store. SRC is 'stdlib' (default), 'environment', "
        "a directory, a glob pattern or a text file.",
    )
    prepare.add_argument("--source", default="stdlib", metavar="SRC", help="stdlib | environment | DIR | GLOB | FILE")
    prepare.add_argument("--out", required=True, metavar="DATA_DIR")
    prepare.add_argument("--force", action="store_true",
                         help="replace a token store in DATA_DIR that was built from another source")
    add_json_flag(prepare)
    prepare.set_defaults(func=_prepare)
    data.set_defaults(func=lambda args: (data.print_help(sys.stderr), ({}, 2))[1])


def _prepare(args: argparse.Namespace) -> dict:
    from delphi.data.store import prepare_store
    from delphi.io import check_output_dir

    from delphi.signals import stop_signals_raise

    check_output_dir(args.out, inputs=(args.source,))
    with stop_signals_raise("no token store was left half-built"):  # SIGTERM/SIGHUP: exit 143/129, one line
        meta = prepare_store(args.source, args.out, force=args.force)
    print(
        f"prepared {args.out}: {meta['files']} files ({meta['documents_train']} train / {meta['documents_val']} val), "
        f"{meta['n_train']:,} train + {meta['n_val']:,} val byte tokens, sha256 {meta['sha256'][:12]}, "
        f"{meta['prepare_s']:.1f} s",
        file=sys.stderr,
    )
    return {"out": str(args.out), **meta}
