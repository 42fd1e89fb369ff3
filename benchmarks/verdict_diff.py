"""The verdicts two versions of a run's report.md give, side by side, where they differ: every claim's
headline ("### NAME: VERDICT") and every diagnostic-power row (task, variant, level -> verdict). The
old version may come from git, so that a rule change is listed against the report it replaced:

    python benchmarks/verdict_diff.py docs/runs/paper_claims --rev 3a264a9
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

CLAIM = re.compile(r"^### (?P<name>.+?): (?P<verdict>supported|not supported|inconclusive(?: \(budget\))?|"
                   r"not testable in this setting|(?:not )?reproduced(?: \(lower bound\))?)$")
VARIANT = re.compile(r"^- under the variant (?P<variant>.+) \(not in the paper\) the same rule gives: (?P<verdict>.+)$")
POWER_HEADER = "| task | variant | level |"


def verdicts(text: str) -> dict[str, str]:
    """'claim: NAME', 'claim: NAME [VARIANT]' (a memory-forcing variant's verdict) and 'power: TASK
    [VARIANT] @ LEVEL' -> verdict, from a report's text."""
    out, power, claim = {}, False, None
    for line in text.splitlines():
        if m := CLAIM.match(line):
            claim = m["name"]
            out[f"claim: {claim}"] = m["verdict"]
        if claim and (m := VARIANT.match(line)):
            out[f"claim: {claim} [{m['variant']}]"] = m["verdict"]
        if line.startswith(POWER_HEADER) and "| best model" in line:
            power, header = True, [c.strip() for c in line.strip("|").split("|")]
            continue
        if power:
            if not line.startswith("|"):
                power = False
            elif not line.startswith("|---"):
                row = dict(zip(header, (c.strip() for c in line.strip("|").split("|"))))
                out[f"power: {row['task']} [{row['variant']}] @ {row['level']}"] = row.get("verdict", "").strip("*")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path, help="a run directory with report.md")
    ap.add_argument("--rev", default="HEAD", help="the git revision whose report.md is the old one (default HEAD)")
    args = ap.parse_args()
    path = args.run / "report.md"
    old = subprocess.run(["git", "show", f"{args.rev}:{path.as_posix()}"], capture_output=True, text=True)
    if old.returncode != 0:
        print(f"verdict_diff: {path} at {args.rev}: {old.stderr.strip()}", file=sys.stderr)
        return 2
    before, after = verdicts(old.stdout), verdicts(path.read_text())
    changed = [k for k in dict.fromkeys([*before, *after]) if before.get(k) != after.get(k)]
    print(f"{args.run}: {len(changed)} of {len(set(before) | set(after))} verdicts changed since {args.rev}")
    for key in changed:
        print(f"  {key}: {before.get(key, '-')} -> {after.get(key, '-')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
