"""`delphi data prepare`: build a token store from a corpus source."""

from __future__ import annotations

import argparse
import sys

from delphi.cli import add_json_flag, positive_int
from delphi.data.shards import DEFAULT_TEXT_FIELD
from delphi.data.store import BPE_TRAIN_BYTES, PrepareOptions, prepare_store
from delphi.path_policy import check_output_dir
from delphi.signals import stop_signals_raise


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    data = subparsers.add_parser("data", help="corpus sources and token stores")
    data_sub = data.add_subparsers(dest="data_command", metavar="SUBCOMMAND")
    prepare = data_sub.add_parser(
        "prepare",
        help="build train.bin/val.bin/meta.json from a source",
        description="Build a token store. SRC is 'stdlib' (default), 'environment', a directory, a glob pattern "
        "or a file. Text files are documents; JSONL (.jsonl, .jsonl.gz, .jsonl.zst, .json.gz), Parquet and "
        "Arrow shards (a `datasets.save_to_disk` directory too) give one document per record. The source is "
        "streamed: memory does not grow with the corpus.",
    )
    prepare.add_argument("--source", default="stdlib", metavar="SRC", help="stdlib | environment | DIR | GLOB | FILE")
    prepare.add_argument("--out", required=True, metavar="DATA_DIR")
    prepare.add_argument(
        "--text-field",
        default=DEFAULT_TEXT_FIELD,
        metavar="NAME",
        help=f"the field (JSONL) or column (Parquet, Arrow) holding a record's text (default {DEFAULT_TEXT_FIELD})",
    )
    prepare.add_argument(
        "--tokenizer",
        default="byte",
        metavar="byte|bpe|FILE",
        help="byte (default: 256 tokens, loss converts exactly to bits per byte), bpe (a byte-level "
        "BPE vocabulary trained here on the train split, --vocab-size tokens), or a "
        "tokenizer.json of the Hugging Face tokenizers package",
    )
    prepare.add_argument(
        "--vocab-size",
        type=positive_int,
        default=None,
        metavar="N",
        help="with --tokenizer bpe: the vocabulary to train",
    )
    prepare.add_argument(
        "--tokenizer-train-bytes",
        type=positive_int,
        default=BPE_TRAIN_BYTES,
        metavar="BYTES",
        help=f"with --tokenizer bpe: train on at most this much text (default {BPE_TRAIN_BYTES:,})",
    )
    prepare.add_argument(
        "--force", action="store_true", help="replace a token store in DATA_DIR that was built from another source"
    )
    prepare.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_json_flag(prepare)
    prepare.set_defaults(func=_prepare)
    data.set_defaults(func=lambda args: (data.print_help(sys.stderr), ({}, 2))[1])


def _prepare(args: argparse.Namespace) -> dict:
    tokenizer_file = () if args.tokenizer in ("byte", "bpe") else (args.tokenizer,)
    check_output_dir(args.out, inputs=(args.source, *tokenizer_file))
    options = PrepareOptions(
        text_field=args.text_field,
        tokenizer=args.tokenizer,
        vocab_size=args.vocab_size,
        tokenizer_train_bytes=args.tokenizer_train_bytes,
        progress=not args.no_progress,
    )
    with stop_signals_raise("no token store was left half-built"):  # SIGTERM/SIGHUP: exit 143/129, one line
        meta = prepare_store(args.source, args.out, force=args.force, options=options)
    tokenizer = meta["tokenizer"]
    unit = (
        "byte" if tokenizer["kind"] == "byte" else f"{tokenizer['kind']} ({tokenizer['vocab_size']:,}-token vocabulary)"
    )
    print(
        f"prepared {args.out}: {meta['files']} documents ({meta['documents_train']} train / {meta['documents_val']} val), "
        f"{meta['n_train']:,} train + {meta['n_val']:,} val {unit} tokens from {meta['bytes']:,} bytes of text, "
        f"sha256 {meta['sha256'][:12]}, {meta['prepare_s']:.1f} s",
        file=sys.stderr,
    )
    return {"out": str(args.out), **meta}
