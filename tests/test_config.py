"""The config file's shape: what is not a section, or is a section of the wrong kind, is one
UserError line that says what to write instead."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckptgw.gateway.config import load_config
from ckptgw.gateway.errors import UserError

SECTIONS = (
    "[store], [cache], [mount], [drain], [shutdown], [preemption], [metrics], [lifecycle], "
    "[[retention]], [log]"
)


def error_for(tmp_path: Path, text: str) -> str:
    cfg = tmp_path / "c.toml"
    cfg.write_text(text)
    with pytest.raises(UserError) as e:
        load_config(str(tmp_path / "mnt"), config_file=str(cfg))
    message = str(e.value)
    assert "\n" not in message and message.startswith(f"config file {cfg}: ")
    return message.removeprefix(f"config file {cfg}: ")


def test_a_top_level_key_is_not_called_a_section(tmp_path: Path) -> None:
    message = error_for(tmp_path, "foo = 1\n")
    assert message == f"unknown top-level key foo: settings go in sections: {SECTIONS}"
    assert "unknown section" not in message


def test_a_top_level_key_of_a_section_says_which(tmp_path: Path) -> None:
    # The usual slip: a setting above the first header.
    message = error_for(tmp_path, 'reserve = "1GiB"\n[cache]\ndir = "/tmp/x"\n')
    assert message.startswith("unknown top-level key reserve: settings go in sections: [store]")
    assert message.endswith("; reserve belongs under [cache]")
    message = error_for(tmp_path, "interval = 5.0\n")
    assert message.endswith("; interval belongs under [preemption] or [lifecycle]")


def test_unknown_sections_list_the_real_ones(tmp_path: Path) -> None:
    assert (
        error_for(tmp_path, "[foo]\na = 1\n")
        == f"unknown section [foo]; the sections are {SECTIONS}"
    )
    assert error_for(tmp_path, "[[foo]]\na = 1\n").startswith("unknown section [[foo]]; ")
    assert error_for(tmp_path, "[cache]\nreserv = 1\n") == "unknown key cache.reserv"


def test_sections_of_the_wrong_kind(tmp_path: Path) -> None:
    assert error_for(tmp_path, "cache = 1\n") == "cache must be one section, [cache], not a value"
    assert error_for(tmp_path, '[[cache]]\ndir = "/x"\n') == (
        "cache must be one section, [cache], not [[cache]] tables"
    )
    one_per_run = "write retention as [[retention]] tables, one per run"
    assert error_for(tmp_path, '[retention]\nrun = "a"\n') == one_per_run
    assert error_for(tmp_path, "retention = [1]\n") == one_per_run


def test_the_documented_shapes_still_load(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        '[cache]\nreserve = "1GiB"\n[[retention]]\nrun = "a"\n[[retention]]\nrun = "b"\n'
        "[log]\nlevel = 'debug'\n"
    )
    c = load_config(str(tmp_path / "mnt"), config_file=str(cfg))
    assert [r.run for r in c.retention] == ["a", "b"] and c.reserve_bytes == 1 << 30
    cfg.write_text("retention = []\n")  # no runs, written inline
    assert load_config(str(tmp_path / "mnt"), config_file=str(cfg)).retention == ()
