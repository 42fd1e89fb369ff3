"""The `tmem-bench leaderboard` subcommands: submit, validate, refresh, build, fetch, show."""
from __future__ import annotations

import sys

from ..errors import MissingExtra, UsageError


def _trust_flag(parser) -> None:
    parser.add_argument("--allow-module-names", action="store_true",
                        help="trust module:attribute task and model names in the entries: importing them runs their "
                             "code, so only for entries of your own, never for submitted ones (never in CI)")


def _full_flag(parser) -> None:
    parser.add_argument("--full", action="store_true",
                        help="re-evaluate every entry, reading no record of an earlier validation on this machine "
                             "(CI, and before publishing a board)")


def add_leaderboard_parser(sub, debug, parser_class) -> None:
    board = sub.add_parser("leaderboard", parents=[debug],
                           help="submit a run as entries, validate entries, build the board")
    actions = board.add_subparsers(dest="action", required=True, parser_class=parser_class)
    submit = actions.add_parser("submit", parents=[debug],
                                help="write leaderboard/entries/<slug>/ for each model of a finished run")
    submit.add_argument("run_dir", metavar="RUN_DIR", help="a finished run directory (manifest.json and cells/)")
    submit.add_argument("--name", required=True,
                        help="the entry's name; with several models, one entry per model named 'NAME (label)'")
    submit.add_argument("--model", metavar="LABEL", help="submit only this model of the run")
    submit.add_argument("--url", help="a link to the paper or code (http or https)")
    submit.add_argument("--description", help="one or two sentences shown with the entry")
    submit.add_argument("--leaderboard", default="leaderboard", help="the leaderboard folder (default: leaderboard)")
    submit.add_argument("--weights-url", metavar="URL",
                        help="reference the weights instead of holding them: the entry records each file's sha256 "
                             "and size and URL/<cell id>.safetensors (upload RUN_DIR/cells/*.safetensors there); "
                             "https://, file:// or hf://OWNER/REPO[@REVISION]/FOLDER")
    _trust_flag(submit)
    validate = actions.add_parser("validate", parents=[debug],
                                  help="recompute every entry from its cells; exit 1 when one is rejected, "
                                       f"{MissingExtra.exit_code} when one cannot be checked without an extra")
    validate.add_argument("path", nargs="?", default="leaderboard", metavar="PATH",
                          help="a leaderboard folder, an entries folder or one entry (default: leaderboard)")
    _trust_flag(validate)
    _full_flag(validate)
    refresh = actions.add_parser("refresh", parents=[debug],
                                 help="rebuild entries' derived numbers (intervals, scores) from their own cells with "
                                      "the installed suite's rules; cells, weights and identity stay as they are")
    refresh.add_argument("slugs", nargs="*", metavar="NAME",
                         help="entry folder names under LEADERBOARD/entries (default: every entry)")
    refresh.add_argument("--leaderboard", default="leaderboard", help="the leaderboard folder (default: leaderboard)")
    _trust_flag(refresh)
    build = actions.add_parser("build", parents=[debug],
                               help="validate every entry, then write README.md and index.html")
    build.add_argument("--leaderboard", default="leaderboard", help="the leaderboard folder (default: leaderboard)")
    build.add_argument("--with", dest="with_run", metavar="RUN_DIR",
                       help="preview: draw the board with this run's models beside the published entries, written "
                            "to --out (default RUN_DIR/board-preview), never into the leaderboard folder")
    build.add_argument("--out", metavar="DIR", help="with --with: where the preview's README.md and index.html go")
    _trust_flag(build)
    _full_flag(build)
    fetch = actions.add_parser("fetch", parents=[debug],
                               help="download the weights entries reference by URL into the local cache, each "
                                    "checked against the sha256 and size its entry records")
    fetch.add_argument("path", nargs="?", default="leaderboard", metavar="PATH",
                       help="a leaderboard folder, an entries folder or one entry (default: leaderboard)")
    fetch.add_argument("--allow-file-urls", action="store_true",
                       help="read the file:// URLs entries give (files of this machine): only for entries of your "
                            "own; without it they are refused unread")
    show = actions.add_parser("show", parents=[debug],
                              help="an entry's cells with their stored numbers and those their weights give here")
    show.add_argument("entry", metavar="ENTRY", help="an entry folder, e.g. leaderboard/entries/<slug>")
    show.add_argument("--cell", metavar="ID", help="only this cell (default: every cell)")
    show.add_argument("--allow-module-names", action="store_true",
                      help="trust module:attribute task and model names in the entry (importing them runs their code)")


def _print_rejections(validation) -> None:
    for line in validation.rejections:
        print(f"rejected: {line}", file=sys.stderr)
    for line in validation.unchecked:
        print(f"not checked: {line}", file=sys.stderr)


def _print_verdict(slug: str, verdict: str, lines: list[str]) -> None:
    """An entry's verdict as soon as it is known (validate's on_entry), on a terminal or in a log: a
    valid entry's line says what was recomputed, on stdout; the others' lines go to stderr."""
    for line in lines:
        if verdict == "valid":
            print(line, flush=True)
        else:
            print(f"{'rejected' if verdict == 'rejected' else 'not checked'}: {line}", file=sys.stderr, flush=True)


def _exit_code(validation) -> int:
    """1 where an entry is rejected; MissingExtra's code where the rest are valid but some need an
    extra not installed here (not the entries' fault, and nothing to fix in them); 0 otherwise."""
    return 1 if validation.rejected else MissingExtra.exit_code if validation.unchecked else 0


def _freshness(validation) -> str:
    cached = sum(s["cached"] for s in validation.rechecked.values())
    return f"{len(validation.rechecked) - cached} validated now, {cached} unchanged since validated here"


def cmd_leaderboard(args) -> int:
    if args.action == "fetch":  # before anything that imports torch: fetching needs no model
        from ..leaderboard.fetch import fetch_board

        return fetch_board(args.path, args.allow_file_urls)
    from ..leaderboard import build, refresh, submit, validate

    if args.action == "submit":
        if args.url is not None and not args.url.startswith(("http://", "https://")):
            raise UsageError(f"--url {args.url!r} must start with http:// or https://")
        from ..registry import module_names

        with module_names(args.allow_module_names):  # a run of your own plug-in named module:attribute
            paths = submit(args.run_dir, args.name, args.leaderboard, args.model, args.url, args.description,
                           args.weights_url)
        for path in paths:
            print(f"entry: {path}")
        print(f"check it with: tmem-bench leaderboard validate {args.leaderboard}")
        return 0
    if args.action == "refresh":
        refreshed, unchanged, failed = refresh(args.leaderboard, args.slugs, args.allow_module_names)
        for slug in refreshed:
            print(f"refreshed: {slug}")
        for line in failed:
            print(f"not refreshed: {line}", file=sys.stderr)
        print(f"{len(refreshed)} refreshed, {len(unchanged)} unchanged, {len(failed)} not refreshed; check them "
              f"with: tmem-bench leaderboard validate {args.leaderboard}")
        return 1 if failed else 0
    if args.action == "show":
        from ..leaderboard.api import show

        return show(args.entry, args.cell, args.allow_module_names)
    if args.action == "validate":
        validation = validate(args.path, args.allow_module_names, args.full, progress=True, on_entry=_print_verdict)
        n, unchecked = len(validation.accepted), len(validation.unchecked)
        print(f"{n} entr{'y' if n == 1 else 'ies'} valid, {len(validation.rejected)} rejected"
              + (f", {unchecked} not checked (an optional extra is not installed)" if unchecked else ""))
        return _exit_code(validation)
    if args.out is not None and args.with_run is None:
        raise UsageError("--out goes with --with RUN_DIR (a preview); the board itself is written into --leaderboard")
    if args.with_run is not None:
        return _preview(args)
    from ..leaderboard import held

    with held(args.leaderboard):  # a submit's entries are all there or none while the board is drawn
        validation = validate(args.leaderboard, args.allow_module_names, args.full, progress=True)
        if validation.rejected or validation.unchecked:
            _print_rejections(validation)
            print("board not written: fix or remove the rejected entries first" if validation.rejected else
                  "board not written: install the extras named above, so that every entry is checked",
                  file=sys.stderr)
            return _exit_code(validation)
        readme, page = build(args.leaderboard, validation.accepted)
    print(f"board: {readme}, {page} ({len(validation.accepted)} entries: {_freshness(validation)})")
    return 0


def _preview(args) -> int:
    """`build --with RUN_DIR`: the run's models re-evaluated and drawn beside the published entries,
    which are shown as committed (re-evaluated too with --full); exit 1 when the run's own weights do
    not give its numbers back (validate would reject its entries)."""
    from ..leaderboard import validate
    from ..leaderboard.preview import banner, committed, preview, preview_entries, preview_folder, reevaluate_run
    from ..registry import module_names

    # Cheap, unlike any re-evaluation: a bad folder or run is refused first.
    out = preview_folder(args.with_run, args.out, args.leaderboard)
    with module_names(args.allow_module_names):  # the run's module:attribute names, as an entry's
        previews = preview_entries(args.with_run)
    if args.full:
        validation = validate(args.leaderboard, args.allow_module_names, True, progress=True)
        published, how = validation.accepted, f"{_freshness(validation)}"
        left_out = validation.rejections + validation.unchecked
    else:
        published, left_out = committed(args.leaderboard)
        how = "as committed, not re-evaluated (--full re-evaluates them)"
    with module_names(args.allow_module_names):
        rejected = reevaluate_run(args.with_run, previews, progress=True)
    readme, page = preview(out, [(slug, entry) for slug, entry, _ in previews], published,
                           banner(args.with_run, len(published), args.full))
    for line in left_out:
        print(f"left out: {line}", file=sys.stderr)
    for line in rejected:
        print(f"the run's weights do not give its numbers back: {line}", file=sys.stderr)
    print(f"preview: {readme}, {page} (the run's models marked 'preview' beside {len(published)} published "
          f"entries, {how}; {len(left_out)} left out)")
    if rejected:
        print("validate would reject these entries once submitted", file=sys.stderr)
    return 1 if rejected else 0
