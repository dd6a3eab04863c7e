"""The corpus store a study trains on: pinned at the prepare stage by its sha256, checked before
each training stage, and the stores a study was told to go on with instead (store_accepted.json)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from delphi.data.store import package_differences, resolve_store
from delphi.errors import DelphiError
from delphi.io import atomic_write_json
from delphi.study.state import Study, ladder_spec, say
from delphi.train.rundir import read_status


def current_store(study: Study) -> dict:
    """The store the study's ladder names, as it is on this machine: its path, sha256, sizes and bytes per package."""
    ladder = ladder_spec(study)
    store = resolve_store(ladder.run.store)
    meta = json.loads((store / "meta.json").read_text())
    return {
        "store": str(store),
        "sha256": meta.get("sha256"),
        "train_tokens": meta.get("n_train"),
        "val_tokens": meta.get("n_val"),
        "bytes_by_package": meta.get("bytes_by_package"),
    }


def check_store_unchanged(study: Study) -> None:
    """A study continued elsewhere (its committed stages copied to a fresh machine) must train on
    the corpus its first rungs trained on: a built-in store is rebuilt from the machine's files
    (`environment`: its installed packages), so compare its sha256 with the one pinned at prepare.

    Each store accepted instead (`--accept-store`) is appended to store_accepted.json with its
    bytes per package and the hero's step when it was accepted, so that a later machine can name
    what differs from the store the study last trained on, and the hero's steps can be traced."""
    prepared = study.done("prepare")
    if prepared is None:
        return
    pinned = prepared["result"].get("sha256")
    now = current_store(study)
    if pinned is None or now["sha256"] == pinned:
        return
    history = read_store_acceptances(study.store_accepted)
    last = history["accepted"][-1] if history["accepted"] else {"sha256": pinned, **prepared["result"]}
    if study.accept_store != now["sha256"]:
        before, after = last.get("bytes_by_package"), now.get("bytes_by_package")
        which = (
            f"; packages that differ from sha256 {last['sha256'][:12]}: {package_differences(before, after)}"
            if before and after
            else ""
        )
        raise DelphiError(
            f"{study.marker('prepare')}: the study's rungs trained on store sha256 {pinned}, but "
            f"{now['store']} now holds sha256 {now['sha256']} (another machine or other installed "
            f"packages{which}); rebuild that corpus, start a new study directory, or pass "
            f"--accept-store {now['sha256']} to go on with it (recorded in {study.store_accepted})"
        )
    if last["sha256"] != now["sha256"]:
        hero = read_status(study.hero_run) or {}
        history["accepted"].append(
            {
                "sha256": now["sha256"],
                "train_tokens": now.get("train_tokens"),
                "val_tokens": now.get("val_tokens"),
                "accepted_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "hero_step": hero.get("step"),
                "bytes_by_package": now.get("bytes_by_package"),
            }
        )
        atomic_write_json(
            study.store_accepted,
            {
                "pinned_sha256": pinned,
                "pinned_train_tokens": prepared["result"].get("train_tokens"),
                "store": now["store"],
                **history,
            },
        )
    say(
        f"store: going on with sha256 {now['sha256'][:12]} ({now.get('train_tokens')} train tokens), not the pinned "
        f"{pinned[:12]} ({prepared['result'].get('train_tokens')}), as --accept-store asked; recorded in {study.store_accepted}"
    )


def read_store_acceptances(path: Path) -> dict[str, list[dict]]:
    """The stores a study went on with instead of its pinned one, oldest first (none if no file).
    A record with accepted_sha256/accepted_train_tokens holds one store."""
    if not path.is_file():
        return {"accepted": []}
    record = json.loads(path.read_text())
    if "accepted_sha256" in record:
        return {
            "accepted": [{"sha256": record["accepted_sha256"], "train_tokens": record.get("accepted_train_tokens")}]
        }
    return {"accepted": list(record.get("accepted", []))}
