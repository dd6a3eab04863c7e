#!/usr/bin/env bash
# The built-in default study at study seed N from a clean clone, the way every seed in summary.csv
# from edition 7 on was run: a fresh venv (`pip install -e .`), the built-in study file with
# `seed: N` and its ladder spec beside it, `delphi study FILE --out runs/study`. The wall includes the
# clone and the install.
#
#   benchmarks/default_study/fresh_seed.sh N [COMMIT] [WORKDIR]     (defaults: HEAD, /tmp/default-study-seedN)
#
# Then archive the run with the files the older archives keep (see README.md) and
# `summarize.py DIR --out summary.csv`.
set -euo pipefail
N=$1
REPO=$(cd "$(dirname "$0")/../.." && pwd)
COMMIT=${2:-$(git -C "$REPO" rev-parse HEAD)}
WORK=${3:-/tmp/default-study-seed$N}
start=$(date +%s)
rm -rf "$WORK" && git clone -q "$REPO" "$WORK" && cd "$WORK" && git checkout -q "$COMMIT"
python3 -m venv .venv && .venv/bin/pip install -q -e . > pip.log 2>&1
mkdir -p study && cp delphi/defaults/ladder_default.yaml study/
sed "s/^seed: 0$/seed: $N/" delphi/defaults/default_study.yaml > study/study.yaml
grep -q "^seed: $N$" study/study.yaml || { echo "study/study.yaml: could not set seed: $N" >&2; exit 2; }
rc=0; .venv/bin/delphi study study/study.yaml --out runs/study 2>&1 | tee study.log || rc=$?
echo "seed=$N rc=$rc total_s=$(( $(date +%s) - start )) commit=${COMMIT:0:7}" | tee wall.txt
exit $rc
