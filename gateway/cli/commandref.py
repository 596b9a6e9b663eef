"""docs/commands.md, the command reference, generated from the CLI's own parser so that it
cannot drift from ``--help``: every command and subcommand, its usage line, what it does, its
arguments and options, its example and the exit codes. ::

    python -m ckptgw.gateway.cli.commandref > docs/commands.md
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from ckptgw.gateway.cli.main import EXAMPLES, EXIT_CODES, _parser


def _subcommands(
    parser: argparse.ArgumentParser,
) -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    """(name, its one-line help, its parser) for each subcommand, in the parser's order."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, sub in action.choices.items():
                yield name, helps.get(name, ""), sub


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _default(action: argparse.Action) -> str:
    """The default where the help does not say it and it means something to a user."""
    if action.default in (None, False, argparse.SUPPRESS) or isinstance(
        action, argparse._StoreTrueAction | argparse._StoreFalseAction
    ):
        return ""
    if action.help and "default" in action.help:
        return ""
    return f" (default: `{action.default}`)"


def _arguments(parser: argparse.ArgumentParser) -> list[str]:
    rows = []
    for a in parser._actions:
        if isinstance(
            a, argparse._HelpAction | argparse._SubParsersAction | argparse._VersionAction
        ):
            continue
        if a.option_strings:
            meta = "" if a.nargs == 0 else f" {a.metavar or a.dest.upper()}"
            name = ", ".join(f"`{o}{meta}`" for o in a.option_strings)
        else:
            name = f"`{a.metavar or a.dest.upper()}`" + (
                "" if a.nargs not in ("?", "*") else " (optional)"
            )
        what = _cell(a.help or "")
        if a.choices is not None and not a.option_strings:
            what = f"one of {', '.join(f'`{c}`' for c in a.choices)}" + (
                f": {what}" if what else ""
            )
        elif a.choices is not None:
            what += f" (one of {', '.join(f'`{c}`' for c in a.choices)})"
        rows.append(f"| {name} | {what}{_default(a)} |")
    if not rows:
        return []
    return ["| argument | what it is |", "|---|---|", *rows, ""]


def _command(
    path: str, what: str, parser: argparse.ArgumentParser, example: str | None
) -> list[str]:
    usage = " ".join(parser.format_usage().removeprefix("usage: ").split())
    line = _cell(what).rstrip(".")
    out = [f"## `{path}`", "", f"{line[:1].upper()}{line[1:]}." if line else "", ""]
    if parser.description:
        out += [_cell(parser.description), ""]
    out += ["```", usage, "```", ""]
    out += _arguments(parser)
    if example:
        out += ["Example:", "", "```", *(x.strip() for x in example.splitlines()), "```", ""]
    return out


def _walk(parser: argparse.ArgumentParser, prefix: str) -> Iterator[list[str]]:
    """Each command that runs something (``lifecycle plan``, not ``lifecycle``), with the
    example its group has where the example is of that command."""
    for name, what, sub in _subcommands(parser):
        path = f"{prefix} {name}"
        if any(True for _ in _subcommands(sub)):
            yield from _walk(sub, path)
            continue
        example = EXAMPLES.get(path.split()[1], "")
        yield _command(path, what, sub, example if example.startswith(f"{path} ") else None)


def reference() -> str:
    parser = _parser()
    out = [
        "# Command reference",
        "",
        "<!-- Generated from the CLI's parser by "
        "`python -m ckptgw.gateway.cli.commandref > docs/commands.md`; do not edit by hand. -->",
        "",
        _cell(parser.description or "") + ". How to use them together: [usage.md](usage.md); "
        "the settings: [config.md](config.md). Every command's `--help` says the same.",
        "",
    ]
    commands = list(_walk(parser, "ckptgw"))
    out += [f"- [`{c[0][4:-1]}`](#{_anchor(c[0])})" for c in commands]
    out += ["", "## Exit codes", "", "```", EXIT_CODES.removeprefix("exit codes:\n"), "```", ""]
    for c in commands:
        out += c
    return "\n".join(out).rstrip("\n") + "\n"


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, spaces to dashes, punctuation dropped."""
    text = heading.removeprefix("## ").strip("`").lower()
    return "".join(ch if ch.isalnum() or ch in "-_" else "-" if ch == " " else "" for ch in text)


if __name__ == "__main__":
    print(reference(), end="")
