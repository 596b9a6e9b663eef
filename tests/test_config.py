"""The config file's shape: what is not a section, or is a section of the wrong kind, is one
UserError line that says what to write instead."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from operator import attrgetter
from pathlib import Path
from typing import Any

import pytest

from ckptgw.drain.reads.fetch import FetchConfig
from ckptgw.drain.reads.listing import ListingConfig
from ckptgw.drain.retention.lifecycle import RunPolicy
from ckptgw.drain.uploads.engine import DrainConfig
from ckptgw.drain.uploads.scheduler import ScheduleConfig
from ckptgw.drain.uploads.upload import UploadConfig
from ckptgw.fsops.filesystem import FsOptions
from ckptgw.gateway.config import _KNOWN, Config, load_config
from ckptgw.gateway.daemon.preemption import WatchConfig
from ckptgw.gateway.errors import UserError
from ckptgw.gateway.nfs.export import load_export
from ckptgw.gateway.settings import ENVIRONMENT, SETTINGS, example, reference
from ckptgw.store.deadlines import Deadlines
from ckptgw.store.pacing import PacingConfig
from ckptgw.store.url import parse_store_url

ROOT = Path(__file__).resolve().parent.parent

SECTIONS = (
    "[store], [cache], [mount], [drain], [shutdown], [preemption], [metrics], [lifecycle], "
    "[[retention]], [log], [nfs]"
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


def test_retention_written_as_one_table_says_to_write_double_brackets(tmp_path: Path) -> None:
    # The usual slip: [retention] where [[retention]] is meant; the message says what to write,
    # with the user's own run as the example.
    text = '[retention]\nrun = "jobs/a"\nkeep_last = 2\n'
    assert error_for(tmp_path, text) == (
        "write [[retention]] (double brackets), not [retention]: one [[retention]] table per "
        'run, e.g. the two lines [[retention]] and run = "jobs/a"'
    )
    assert error_for(tmp_path, "[retention]\n").endswith('[[retention]] and run = "jobs/llama"')
    cfg = tmp_path / "fixed.toml"
    cfg.write_text(text.replace("[retention]", "[[retention]]"))  # doing what it says works
    (run,) = load_config(str(tmp_path / "mnt"), config_file=str(cfg)).retention
    assert run.run == "jobs/a" and run.policy.keep_last == 2


def test_a_bad_log_level_lists_the_choices(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('[log]\nlevel = "verbose"\n')
    choices = "is not one of debug, info, warning, error"
    with pytest.raises(UserError, match=f"^config: log.level = 'verbose' {choices}$"):
        load_config(str(tmp_path / "mnt"), config_file=str(cfg))
    with pytest.raises(UserError, match=f"^config: --log-level = 'loud' {choices}$"):
        load_config(str(tmp_path / "mnt"), log_level="loud")
    cfg.write_text('[log]\nlevel = "DEBUG"\nfile = "x.log"\n')
    c = load_config(str(tmp_path / "mnt"), config_file=str(cfg), log_level="Warning")
    assert c.log_level == "warning" and c.log_file == Path(os.path.abspath("x.log"))


def test_an_empty_config_file_gives_every_default_of_the_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Iterates gateway/settings.py: a default written there and not used by load_config (or
    Config, or the drain's RunPolicy) fails here, whichever one drifts."""
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    mnt = tmp_path / "mnt"
    escaped = str(mnt).strip("/").replace("/", "-")
    root = os.geteuid() == 0
    cpus = os.cpu_count() or 1
    computed = {  # the defaults the table describes in words (docs/config.md says the same)
        "store.url": parse_store_url(
            "file:///var/lib/ckptgw/store" if root else f"file://{tmp_path}/data/ckptgw/store"
        ),
        "store.endpoint_url": None,  # AWS's own endpoint
        "cache.dir": Path("/var/cache/ckptgw" if root else f"{tmp_path}/cache/ckptgw") / escaped,
        "cache.size": None,  # the cache disk's room
        "cache.fetch_chunk": None,  # adapts to each object
        "drain.yield_to_saves": 30.0 if cpus <= 4 else 0.0,
        "drain.part_workers": 0 if cpus <= 4 else min(4, cpus // 4),
        "log.file": None,  # <cache dir>/ckptgw.log
        "retention.run": "a",  # required: the test's own
    }
    assert {s.name for s in SETTINGS if s.default is None} == set(computed)
    empty = tmp_path / "empty.toml"
    empty.write_text("")
    loaded = load_config(str(mnt), config_file=str(empty))
    bare = Config(mountpoint=mnt, store=loaded.store, cache_dir=loaded.cache_dir)
    one_run = tmp_path / "run.toml"
    one_run.write_text('[[retention]]\nrun = "a"\n')
    (run,) = load_config(str(mnt), config_file=str(one_run)).retention
    export = load_export(mnt, str(empty), clients="10.0.0.0/8")  # clients: required
    for s in SETTINGS:
        expected = computed[s.name] if s.default is None else s.kind.parse(s.default, s.name)
        get = attrgetter(s.field)
        if s.section == "nfs":
            want = ("10.0.0.0/8",) if s.key == "clients" else expected
            assert get(export) == want, f"load_export nfs.{s.key}: {get(export)!r} != {want!r}"
        elif s.section == "retention":
            assert get(run) == expected, f"[[retention]] {s.key}: {get(run)!r}, table: {expected!r}"
            assert get(RunPolicy("a")) == expected or s.key == "run", f"RunPolicy {s.key}"
        else:
            assert get(loaded) == expected, f"load_config {s.name}: {get(loaded)!r} != {expected!r}"
            assert get(bare) == expected or s.default is None, f"Config default of {s.name}"
    # ... and every Config field that a file can set is in the table.
    fields = {f.name for f in dataclasses.fields(Config)}
    covered = {s.field.split(".")[0] for s in SETTINGS if s.section not in ("retention", "nfs")}
    assert fields - covered == {"mountpoint", "foreground", "retention"}
    assert covered <= fields


def test_docs_config_md_is_the_generated_reference() -> None:
    doc = (ROOT / "docs/config.md").read_text()
    assert doc == reference(), "regenerate with: python -m ckptgw.gateway.settings > docs/config.md"


def test_the_reference_has_every_section_and_key() -> None:
    doc = reference()
    chunks = re.split(r"^## ", doc, flags=re.MULTILINE)
    for section, keys in _KNOWN.items():
        header = "[[retention]]" if section == "retention" else f"[{section}]"
        (chunk,) = [c for c in chunks if c.startswith(f"`{header}`")]
        for key in keys:
            assert f"\n| `{key}` | " in chunk, f"{section}.{key} is missing from docs/config.md"


def test_the_example_is_a_config_file_that_loads(tmp_path: Path) -> None:
    cfg = tmp_path / "example.toml"
    cfg.write_text(example())
    c = load_config(str(tmp_path / "mnt"), config_file=str(cfg))
    assert str(c.store) == "s3://my-bucket/checkpoints/" and c.cache_size == 200 << 30
    assert [r.run for r in c.retention] == ["jobs/llama"] and c.retention[0].marker == ".metadata"
    assert f"```toml\n{example()}```" in reference()


def test_every_flag_in_the_reference_is_a_flag_of_its_command() -> None:
    for section, command in (("nfs", ["serve", "nfs"]), (None, ["mount"])):
        r = subprocess.run(
            [sys.executable, "-m", "ckptgw.gateway.cli", *command, "--help"],
            capture_output=True,
            text=True,
            check=True,
        )
        flags = {s.flag for s in SETTINGS if s.flag and (s.section == "nfs") == (section == "nfs")}
        assert flags and {f for f in flags if f not in r.stdout} == set(), command


def test_every_environment_variable_the_code_reads_is_in_the_reference() -> None:
    read = re.compile(
        r'environ(?:\.get|\.pop)?\s*[(\[]\s*"([A-Z][A-Z0-9_]*)"'
        r'|"([A-Z][A-Z0-9_]*)"\s+(?:not\s+)?in\s+os\.environ'
    )
    names = set()
    for folder in ("gateway", "drain", "fsops"):
        for path in (ROOT / folder).glob("*.py"):
            names |= {a or b for a, b in read.findall(path.read_text())}
    assert "CKPTGW_RUNTIME_DIR" in names and "NO_COLOR" in names  # the scan works
    documented = " ".join(f"{name} {what}" for name, what in ENVIRONMENT)
    assert {n for n in names if n not in documented} == set(), "add them to settings.ENVIRONMENT"


def test_the_lower_configs_default_to_the_table() -> None:
    """A module below the gateway may not import it, so its config object restates defaults for
    its own tests and benches: each one is the table's, under the table's name (the key, or the
    Config field), and every field Config hands it is one the table names."""
    lower: dict[type[Any], tuple[str, ...]] = {
        Deadlines: ("store",),
        PacingConfig: ("store",),
        FsOptions: ("cache", "mount"),
        ScheduleConfig: ("drain",),
        DrainConfig: ("drain",),
        UploadConfig: ("drain",),
        ListingConfig: ("store",),
        FetchConfig: ("cache",),
        WatchConfig: ("preemption",),
    }
    checked = 0
    for cls, sections in lower.items():
        for f in dataclasses.fields(cls):
            found = [s for s in SETTINGS if s.section in sections and f.name in (s.key, s.field)]
            if not found or f.default is dataclasses.MISSING:
                continue
            (s,) = found
            want = None if s.default is None else s.kind.parse(s.default, s.name)
            if s.default is None and s.name not in ("cache.size", "cache.fetch_chunk"):
                continue  # computed on the machine that runs (yield_to_saves)
            assert f.default == want, f"{cls.__name__}.{f.name} = {f.default!r}, {s.name}: {want!r}"
            checked += 1
    assert checked >= 20, checked
