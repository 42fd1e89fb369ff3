#!/bin/bash
# What a resubmission of the study's seven entries adds to a fresh clone, with the weights held in
# the entries and referenced by URL: bash benchmarks/clone_growth.sh [REPO] [SCRATCH]
set -euo pipefail
repo=$(cd "${1:-.}" && pwd)
scratch=${2:-$(mktemp -d)}
here=$(cd "$(dirname "$0")" && pwd)
python=${PYTHON:-python3}
cd "$scratch"
git clone -q --no-local "$repo" base
size() { (cd "$1" && echo "$1: .git $(du -sb .git | cut -f1) bytes; $(git count-objects -v | grep size-pack)"); }
size base
for mode in held referenced; do
  git clone -q --no-local "$scratch/base" "work-$mode"
  (cd "work-$mode" && "$python" "$here/resubmit_sim.py" . "$mode" && git add leaderboard/entries &&
   git -c user.name=m -c user.email=m@x commit -q -m "resubmission ($mode)")
  git clone -q --no-local "$scratch/work-$mode" "clone-$mode"
  size "clone-$mode"
done
