"""Shell completion, generated from the CLI's own parser so that it cannot drift:
``ckptgw completion bash`` (or ``zsh``, through bash's completion in zsh)."""

from __future__ import annotations

import argparse


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _options(parser: argparse.ArgumentParser) -> list[str]:
    return sorted(o for a in parser._actions for o in a.option_strings if o.startswith("--"))


def _words(parser: argparse.ArgumentParser, path: str = "") -> dict[str, str]:
    """What may follow each command path ("", "lifecycle", "lifecycle plan", ...)."""
    subs = _subparsers(parser)
    out = {path: " ".join([*subs, *_options(parser)])}
    for name, sub in subs.items():
        out.update(_words(sub, f"{path} {name}".strip()))
    return out


def bash(parser: argparse.ArgumentParser) -> str:
    cases = "\n".join(
        f'        "{path}") words="{words}" ;;' for path, words in _words(parser).items()
    )
    return f"""# ckptgw completion for bash (zsh: through bashcompinit), made by: ckptgw completion
_ckptgw() {{
    local cur=${{COMP_WORDS[COMP_CWORD]}} path="" words="" w
    for w in "${{COMP_WORDS[@]:1:COMP_CWORD-1}}"; do
        local next="${{path:+$path }}$w"
        case "$w" in -*) ;; *) [[ -n "$(_ckptgw_words "$next")" ]] && path="$next" ;; esac
    done
    words=$(_ckptgw_words "$path")
    if [[ "$cur" == -* || -n "$words" && ! "$words" =~ ^-- ]]; then
        mapfile -t COMPREPLY < <(compgen -W "$words" -- "$cur")
    fi
    [[ ${{#COMPREPLY[@]}} -eq 0 ]] && mapfile -t COMPREPLY < <(compgen -f -- "$cur")
    return 0
}}
_ckptgw_words() {{
    local words=""
    case "$1" in
{cases}
    esac
    echo "$words"
}}
complete -o filenames -F _ckptgw ckptgw
"""


def zsh(parser: argparse.ArgumentParser) -> str:
    return "autoload -U +X bashcompinit && bashcompinit\n" + bash(parser)
