"""Lifecycle against the file store and the S3 server: plan and apply delete exactly what the
plan said (never a checkpoint only partly in the store), pins set on one gateway are honoured
by another, the periodic mode, and the bucket's lifecycle rules round-trip with others' rules
kept. What a resuming node and an operator look for: pins only of checkpoints that exist,
``pins``, the store's checkpoints in a fresh node's status, what completeness waits for, and a
local store never called plain durable."""

from __future__ import annotations

import errno
import json
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import jsonschema
import pytest

from tests.conftest import CheckedGateway, GatewayFactory, errno_of, needs_fuse
from tests.test_cli import assert_one_line_error
from tests.test_drain import file_store_objects, wait_for
from tests.test_readthrough import write_toml

pytestmark = [pytest.mark.mount, needs_fuse]

RETENTION = {"run": "run1", "keep_last": 2, "keep_every": 4, "marker": ".metadata"}


@dataclass
class Setup:
    # node(name, retention=None, **lifecycle) -> a gateway on the store; retention: the
    # [[retention]] table (default RETENTION)
    node: Callable[..., CheckedGateway]
    objects: Callable[[], set[str]]  # keys in the store, without the gateway's own
    tags: Callable[[str], dict[str, str]]
    kind: str
    pin_keys: Callable[[], set[str]]  # the pins in the store: their keys under .ckptgw-pins/


@pytest.fixture(params=["file", "s3"])
def setup(
    request: pytest.FixtureRequest, gateway: GatewayFactory, tmp_path: Path
) -> Iterator[Setup]:
    def config(
        name: str, lifecycle: dict[str, object], retention: dict[str, object] | None = None
    ) -> Path:
        sections: dict[str, dict[str, object]] = {
            "drain": {"settle": 600.0},
            "lifecycle": lifecycle,
        }
        path = write_toml(tmp_path / f"{name}.toml", sections)
        with path.open("a") as f:  # [[retention]] is an array of tables
            f.write(
                "[[retention]]\n"
                + "".join(f"{k} = {json.dumps(v)}\n" for k, v in (retention or RETENTION).items())
            )
        return path

    if request.param == "file":
        root = tmp_path / "store"

        def node(
            name: str, retention: dict[str, object] | None = None, **lifecycle: object
        ) -> CheckedGateway:
            cfg = config(name, lifecycle, retention)
            return gateway(name, "--config", str(cfg), store=f"file://{root}")

        def objects() -> set[str]:
            return {k for k in file_store_objects(root) if not k.startswith(".ckptgw-pins/")}

        def pin_keys() -> set[str]:  # file_store_objects leaves the .ckptgw- names out
            pins = root / ".ckptgw-pins"
            found = pins.rglob("*") if pins.exists() else []
            return {f"{pins.name}/{p.relative_to(pins).as_posix()}" for p in found if p.is_file()}

        def tags(key: str) -> dict[str, str]:
            try:
                return dict(json.loads(os.getxattr(root / key, "user.ckptgw.tags")))
            except OSError as e:
                assert e.errno == errno.ENODATA
                return {}

        yield Setup(node, objects, tags, "file", pin_keys)
        return
    endpoint = request.getfixturevalue("s3_endpoint")
    bucket = request.getfixturevalue("bucket")
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")

    def s3_node(
        name: str, retention: dict[str, object] | None = None, **lifecycle: object
    ) -> CheckedGateway:
        cfg = config(name, lifecycle, retention)
        return gateway(
            name, "--config", str(cfg), "--endpoint-url", endpoint, store=f"s3://{bucket}/ck/"
        )

    def s3_keys() -> set[str]:
        listed = s3.list_objects_v2(Bucket=bucket, Prefix="ck/").get("Contents", [])
        return {o["Key"].removeprefix("ck/") for o in listed}

    def s3_objects() -> set[str]:
        return {k for k in s3_keys() if not k.startswith(".ckptgw-pins/")}

    def s3_pin_keys() -> set[str]:
        return {k for k in s3_keys() if k.startswith(".ckptgw-pins/")}

    def s3_tags(key: str) -> dict[str, str]:
        r = s3.get_object_tagging(Bucket=bucket, Key=f"ck/{key}")
        return {t["Key"]: t["Value"] for t in r["TagSet"]}

    yield Setup(s3_node, s3_objects, s3_tags, "s3", s3_pin_keys)


def write_checkpoints(gw: CheckedGateway, steps: range, *, complete: bool = True) -> None:
    for step in steps:
        d = gw.mountpoint / "run1" / f"step_{step}"
        d.mkdir(parents=True)
        (d / "model.pt").write_bytes(bytes([step]) * 1000)
        if complete:
            (d / ".metadata").write_bytes(b"dcp commit marker")


def lifecycle(gw: CheckedGateway, action: str, *args: str) -> dict[str, Any]:
    r = gw.cli("lifecycle", action, str(gw.mountpoint), *args, "--json")
    doc: dict[str, Any] = json.loads(r.stdout)
    return doc


def test_plan_and_apply_delete_exactly_what_the_plan_said(setup: Setup) -> None:
    gw = setup.node("a", storage_class="GLACIER_IR")  # milestones have a class to go to
    write_checkpoints(gw, range(1, 7))
    write_checkpoints(gw, range(7, 8), complete=False)  # being written: no marker yet
    r = gw.cli("flush", "--wait", "--timeout", "60", str(gw.mountpoint / "run1"))
    assert r.returncode == 0, r.stderr
    # Written after the flush, never drained: step_3 is now only partly in the store.
    (gw.mountpoint / "run1" / "step_3" / "extra.pt").write_bytes(b"only in this cache")
    before = setup.objects()

    plan = {p["path"]: (p["action"], p["reason"]) for p in lifecycle(gw, "plan")["plan"]}
    assert plan == {
        "run1/step_7": (
            "keep",
            "newer than the newest complete checkpoint; "
            "incomplete: marker .metadata not in the store yet",
        ),
        "run1/step_6": ("keep", "newest complete checkpoint"),
        "run1/step_5": ("keep", "one of the last 2"),
        "run1/step_4": ("transition", "milestone (every 4 steps)"),
        "run1/step_3": ("keep", "not entirely in the store yet"),
        "run1/step_2": ("delete", "older than the last 2"),
        "run1/step_1": ("delete", "older than the last 2"),
    }
    text = gw.cli("lifecycle", "plan").stdout
    assert "run1/step_2" in text and "delete" in text and "older than the last 2" in text

    done = lifecycle(gw, "apply")
    assert done["deleted"] == 2 and done["tagged"] == 1
    doomed = {k for k in before if k.startswith(("run1/step_1/", "run1/step_2/"))}
    assert len(doomed) == 4  # two files each (their directories have no marker: implied)
    assert setup.objects() == before - doomed  # exactly the plan's deletes, nothing else
    assert sorted(os.listdir(gw.mountpoint / "run1")) == [
        "step_3",
        "step_4",
        "step_5",
        "step_6",
        "step_7",
    ]
    assert (gw.mountpoint / "run1" / "step_3" / "extra.pt").read_bytes() == b"only in this cache"
    for key in ("run1/step_4/model.pt", "run1/step_4/.metadata"):
        assert setup.tags(key) == {"ckptgw-class": "milestone"}
    assert setup.tags("run1/step_5/model.pt") == {}

    # Another node plans from the same bucket. It cannot see a's undrained extra.pt, so to it
    # step_3 is complete and old (what min_age is for: drain lag on other nodes). b has no
    # lifecycle.storage_class: its milestones are only kept, not "transition".
    b = setup.node("b")
    again = {p["path"]: (p["action"], p["reason"]) for p in lifecycle(b, "plan")["plan"]}
    assert {path: action for path, (action, _) in again.items()} == {
        "run1/step_7": "keep",
        "run1/step_6": "keep",
        "run1/step_5": "keep",
        "run1/step_4": "keep",
        "run1/step_3": "delete",
    }
    assert again["run1/step_4"] == ("keep", "milestone (every 4 steps)")
    assert "transition" not in b.cli("lifecycle", "plan", str(b.mountpoint)).stdout


def test_pins_from_one_gateway_are_honoured_by_another(setup: Setup) -> None:
    a = setup.node("a")
    write_checkpoints(a, range(1, 5))
    assert a.cli("flush", "--wait", "--timeout", "60").returncode == 0
    r = a.cli("pin", str(a.mountpoint / "run1" / "step_1"))
    assert r.returncode == 0 and "pinned" in r.stdout
    b = setup.node("b")
    plan_b = {p["path"]: p["reason"] for p in lifecycle(b, "plan")["plan"]}
    assert plan_b["run1/step_1"] == "pinned"
    assert not any(p.startswith(".ckptgw") for p in os.listdir(b.mountpoint))  # pins are hidden
    assert errno_of(os.mkdir, b.mountpoint / ".ckptgw-pins") == errno.EPERM

    # step_1 is listed on b now (b's plan listed the bucket); unpin there, apply on a.
    assert b.cli("unpin", str(b.mountpoint / "run1" / "step_1")).returncode == 0
    done = lifecycle(a, "apply")
    deleted = {p["path"] for p in done["plan"] if p["action"] == "delete"}
    assert deleted == {"run1/step_1", "run1/step_2"}
    assert not any(k.startswith(("run1/step_1/", "run1/step_2/")) for k in setup.objects())

    r = a.cli("pin", str(a.mountpoint / "run1"), check=False)
    assert_one_line_error(r, "is not a checkpoint")
    r = a.cli("lifecycle", "plan", "--run", "nope", check=False)  # one gateway left: no name
    b.stop()
    r = a.cli("lifecycle", "plan", "--run", "nope", check=False)
    assert_one_line_error(r, "no retention policy for run 'nope'")


def test_symlinks_keep_their_targets_and_markers_go_with_their_checkpoint(setup: Setup) -> None:
    a = setup.node("a")
    write_checkpoints(a, range(1, 5))
    run = a.mountpoint / "run1"
    (run / "best.ckpt").symlink_to("step_1/model.pt")  # kept: deleting would leave it dangling
    (run / "last.ckpt").symlink_to("step_4/model.pt")  # Lightning's save_last="link"
    (run / "step_9").mkdir()  # made before its files: a marker only, never complete
    assert a.cli("flush", "--wait", "--timeout", "60").returncode == 0
    # step_9 is empty: its marker is its only object; step_2 holds files: no marker
    assert {"run1/step_9/", "run1/best.ckpt"} <= setup.objects()
    assert "run1/step_2/" not in setup.objects()
    want = {
        "run1/step_9": (
            "keep",
            "newer than the newest complete checkpoint; "
            "incomplete: only its directory is in the store, none of its files",
        ),
        "run1/step_4": ("keep", "newest complete checkpoint"),
        "run1/step_3": ("keep", "one of the last 2"),
        "run1/step_2": ("delete", "older than the last 2"),
        "run1/step_1": ("keep", "a symlink points to it (run1/best.ckpt)"),
    }
    # A node that has listed nothing reads the symlink's target from the store.
    b = setup.node("b")
    plan_b = {p["path"]: (p["action"], p["reason"]) for p in lifecycle(b, "plan")["plan"]}
    assert plan_b == want
    done = lifecycle(a, "apply")
    assert {p["path"]: (p["action"], p["reason"]) for p in done["plan"]} == want
    left = setup.objects()
    assert not any(k.startswith("run1/step_2") for k in left)
    assert {"run1/step_1/model.pt", "run1/best.ckpt", "run1/step_9/"} <= left
    assert (run / "best.ckpt").read_bytes() == bytes([1]) * 1000


def test_the_periodic_mode_applies_the_policy(setup: Setup) -> None:
    gw = setup.node("a", interval=0.5)
    write_checkpoints(gw, range(1, 4))
    assert gw.cli("flush", "--wait", "--timeout", "60").returncode == 0
    wait_for("step_1 to go", lambda: not any(k.startswith("run1/step_1/") for k in setup.objects()))
    assert {k.split("/")[1] for k in setup.objects()} == {"step_2", "step_3"}  # run1/: no marker
    # The objects go first; the line is logged once this node's names are dropped too.
    log = gw.cache_dir / "ckptgw.log"
    wait_for("the retention log line", lambda: "retention: deleted run1/step_1" in log.read_text())


def test_bucket_rules_round_trip_and_keep_other_rules(setup: Setup) -> None:
    gw = setup.node("a", storage_class="GLACIER_IR", transition_days=30, abort_days=3)
    if setup.kind == "file":
        r = gw.cli("lifecycle", "rules", check=False)
        assert_one_line_error(r, "lifecycle rules need an S3 store")
        return
    store = gw.status()["store"]
    bucket = store.removeprefix("s3://").split("/")[0]
    endpoint = gw.extra_args[gw.extra_args.index("--endpoint-url") + 1]
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    theirs = {
        "ID": "team-expire-logs",
        "Status": "Enabled",
        "Filter": {"Prefix": "logs/"},
        "Expiration": {"Days": 14},
    }
    s3.put_bucket_lifecycle_configuration(Bucket=bucket, LifecycleConfiguration={"Rules": [theirs]})
    shown = lifecycle(gw, "rules")
    assert shown["applied"] is False
    assert [r["ID"] for r in shown["proposed"]] == [
        "team-expire-logs",
        "ckptgw-abort-incomplete-uploads",
        "ckptgw-milestones",
    ]
    for _ in range(2):  # applying twice changes nothing the second time
        assert lifecycle(gw, "rules", "--apply")["applied"] is True
        rules = {r["ID"]: r for r in s3.get_bucket_lifecycle_configuration(Bucket=bucket)["Rules"]}
        assert set(rules) == {
            "team-expire-logs",
            "ckptgw-abort-incomplete-uploads",
            "ckptgw-milestones",
        }
    assert rules["team-expire-logs"]["Expiration"]["Days"] == 14
    assert rules["ckptgw-abort-incomplete-uploads"]["AbortIncompleteMultipartUpload"] == {
        "DaysAfterInitiation": 3
    }
    milestones = rules["ckptgw-milestones"]
    assert milestones["Transitions"][0]["StorageClass"] == "GLACIER_IR"
    assert milestones["Filter"]["And"]["Tags"] == [{"Key": "ckptgw-class", "Value": "milestone"}]
    assert milestones["Filter"]["And"]["Prefix"] == "ck/"


def test_retention_and_pattern_config_errors_are_one_line(tmp_path: Path) -> None:
    from ckptgw.gateway.config import load_config
    from ckptgw.gateway.errors import UserError

    cases = {
        "[[retention]]\nkeep_last = 2\n": "needs run",
        '[[retention]]\nrun = "r"\nkeep_last = 0\n': "retention.keep_last = 0",
        '[[retention]]\nrun = "r"\nkeeplast = 2\n': "unknown key retention.keeplast",
        '[lifecycle]\npatterns = ["save(\\\\d+)", "x"]\n': "needs one group",
        '[lifecycle]\npatterns = ["save((\\\\d+)"]\n': "is not a regex",
    }
    for text, needle in cases.items():
        (tmp_path / "c.toml").write_text(text)
        with pytest.raises(UserError, match=needle.replace("(", r"\(")):
            load_config(str(tmp_path / "m"), config_file=str(tmp_path / "c.toml"))
    (tmp_path / "c.toml").write_text(
        '[lifecycle]\npatterns = ["save(\\\\d+)"]\n[[retention]]\nrun = "/r/"\nkeep_every = 5\n'
    )
    cfg = load_config(str(tmp_path / "m"), config_file=str(tmp_path / "c.toml"))
    assert cfg.checkpoint_patterns == (r"save(\d+)",)
    (run,) = cfg.retention
    assert run.run == "r" and run.policy.keep_every == 5 and run.policy.keep_last == 3


# -- what a resuming node and an operator look for ---------------------------------------------


def rows_of(gw: CheckedGateway) -> dict[str, dict[str, Any]]:
    """Status's checkpoint rows by path relative to the mount (steps only)."""
    mp = str(gw.mountpoint) + "/"
    return {c["path"].removeprefix(mp): c for c in gw.status()["checkpoints"] if c["step"]}


def test_pin_only_what_exists_unpin_says_so_and_pins_lists_them(setup: Setup) -> None:
    a = setup.node("a")
    write_checkpoints(a, range(1, 4))
    assert a.cli("flush", "--wait", "--timeout", "60").returncode == 0
    run = a.mountpoint / "run1"
    r = a.cli("pin", str(run / "step_1000000"), check=False)
    assert_one_line_error(r, "run1/step_1000000: no such checkpoint")
    assert setup.pin_keys() == set()  # nothing pinned

    assert a.cli("pin", str(run / "step_1")).stdout.strip() == f"pinned: {run / 'step_1'}"
    (run / "step_9").mkdir()
    (run / "step_9" / "model.pt").write_bytes(b"only in this cache")  # settle: not drained
    assert a.cli("pin", str(run / "step_9")).returncode == 0  # it exists, on this node
    assert setup.pin_keys() == {".ckptgw-pins/run1/step_1", ".ckptgw-pins/run1/step_9"}
    r = a.cli("unpin", str(run / "step_2"))
    assert r.returncode == 0 and r.stdout.strip() == f"not pinned: {run / 'step_2'}"

    listed = json.loads(a.cli("pins", str(a.mountpoint), "--json").stdout)["pins"]
    assert {p["path"]: p["where"] for p in listed} == {
        "run1/step_1": "both",  # as status says it: on this node and in the store
        "run1/step_9": "local",
    }
    assert all(p["pinned_at"] for p in listed)
    text = a.cli("pins").stdout
    assert f"{run / 'step_1'}  pinned " in text and "only in this node's cache" in text
    st = a.status()
    assert [p["path"] for p in st["pins"]["items"]] == [str(run / "step_1"), str(run / "step_9")]
    assert {p: c["pinned"] for p, c in rows_of(a).items()} == {
        "run1/step_9": True,
        "run1/step_3": False,
        "run1/step_2": False,
        "run1/step_1": True,
    }
    assert "pins      2: run1/step_1, run1/step_9" in a.cli("status", str(a.mountpoint)).stdout

    # Unpinned, then deleted by apply: a pin of it names nothing now.
    assert a.cli("unpin", str(run / "step_1")).stdout.strip() == f"unpinned: {run / 'step_1'}"
    assert a.cli("unpin", str(run / "step_9")).returncode == 0
    done = lifecycle(a, "apply")
    assert {p["path"] for p in done["plan"] if p["action"] == "delete"} == {"run1/step_1"}
    r = a.cli("pin", str(run / "step_1"), check=False)
    assert_one_line_error(r, "run1/step_1: no such checkpoint")
    assert setup.pin_keys() == set()
    assert a.cli("pins").stdout.strip() == "no pins"
    assert a.status()["pins"]["items"] == []


def test_a_fresh_node_lists_the_checkpoints_in_the_store(setup: Setup) -> None:
    from tests.test_operate import SCHEMA

    a = setup.node("a")
    write_checkpoints(a, range(1, 4))
    write_checkpoints(a, range(4, 5), complete=False)  # no marker: not complete
    assert a.cli("flush", "--wait", "--timeout", "60").returncode == 0
    b = setup.node("b")  # a new cache dir on the same store: what a resuming node has
    wait_for("the store's checkpoints in b's status", lambda: len(rows_of(b)) == 4)
    got = rows_of(b)
    assert {p: (c["where"], c["state"], c["complete"]) for p, c in got.items()} == {
        "run1/step_4": ("store", "durable", False),
        "run1/step_3": ("store", "durable", True),
        "run1/step_2": ("store", "durable", True),
        "run1/step_1": ("store", "durable", True),
    }
    assert got["run1/step_4"]["waiting"] == "marker .metadata not in the store yet"
    assert got["run1/step_1"]["files"] == 2  # model.pt and .metadata (not the directory)
    st = b.status()
    jsonschema.validate(st, SCHEMA)
    listing = st["store_listing"]
    assert listing["listed_at"] and listing["checkpoints"] == 4 and not listing["truncated"]
    text = b.cli("status", str(b.mountpoint)).stdout
    assert "no files yet" not in text
    assert "in store  4 checkpoints (the store listed " in text
    line = next(x for x in text.splitlines() if "run1/step_4" in x)
    assert "  store  " in line and "no: marker .metadata not in the store yet" in line

    os.listdir(b.mountpoint / "run1" / "step_2")  # b looks at one: now it is on both
    assert rows_of(b)["run1/step_2"]["where"] == "both"
    assert rows_of(b)["run1/step_1"]["where"] == "store"


def test_without_retention_runs_status_still_finds_the_stores_checkpoints(
    gateway: GatewayFactory,
) -> None:
    a = gateway("a")
    for step in (10, 20):
        d = a.mountpoint / "jobs" / "llama" / f"global_step{step}"
        d.mkdir(parents=True)
        (d / "weights.pt").write_bytes(bytes([step]) * 100)
    assert a.cli("flush", "--wait", "--timeout", "60").returncode == 0
    b = gateway("b")  # same store, no [[retention]]: the walk covers the whole prefix
    want = {"jobs/llama/global_step20", "jobs/llama/global_step10"}
    wait_for("the store's checkpoints in b's status", lambda: set(rows_of(b)) == want)
    for c in rows_of(b).values():
        assert (c["where"], c["complete"], c["pinned"]) == ("store", None, False)
    assert b.status()["store_listing"]["roots"] == [""]
    # Nothing says whether they are whole (a node may have died part-way through its drain):
    # the text says so, it does not leave the cell blank.
    text = b.cli("status", str(b.mountpoint)).stdout
    assert (
        "global_step20" in text
        and " unknown" in text
        and "COMPLETE unknown: no [[retention]]" in text
    )


def test_a_plan_before_quiet_says_what_completeness_waits_for(setup: Setup) -> None:
    gw = setup.node("a", retention={"run": "run1", "keep_last": 2})  # no marker: quiet 300 s
    write_checkpoints(gw, range(1, 3))
    assert gw.cli("flush", "--wait", "--timeout", "60").returncode == 0
    plan = lifecycle(gw, "plan")["plan"]
    assert len(plan) == 2
    for p in plan:
        assert p["action"] == "keep"
        assert p["reason"].startswith("no complete checkpoint yet; incomplete: quiet for ")
        assert p["reason"].endswith(" s more, or add a marker (retention.marker, e.g. .metadata)")
    assert "add a marker (retention.marker" in gw.cli("lifecycle", "plan").stdout
    for c in rows_of(gw).values():
        assert c["complete"] is False and c["waiting"].startswith("quiet for ")
    line = next(x for x in gw.cli("status").stdout.splitlines() if "run1/step_2" in x)
    assert "no: quiet for " in line


def test_only_a_local_store_reads_durable_local_store(setup: Setup) -> None:
    gw = setup.node("a")
    write_checkpoints(gw, range(1, 3))
    assert gw.cli("flush", "--wait", "--timeout", "60").returncode == 0
    st = gw.status()
    assert {c["state"] for c in st["checkpoints"]} == {"durable"}  # the JSON enum stays
    gw.cli("pin", str(gw.mountpoint / "run1" / "step_1"))
    text = gw.cli("status", str(gw.mountpoint)).stdout
    plan = gw.cli("lifecycle", "plan").stdout
    pins = gw.cli("pins").stdout
    bare = re.compile(r"\bdurable\b(?! \(local store\))")
    if setup.kind == "file":  # a temp dir on this node's own disk
        assert st["store_local"] is True
        assert "is on this node's own disk" in text.splitlines()[1]
        assert st["store"] in text.splitlines()[1]
        assert "durable (local store)" in text
        for out in (text, plan, pins):
            assert not bare.search(out), out
        assert "local store" in plan.splitlines()[0] and "in the local store" in pins
    else:
        assert st["store_local"] is False
        assert "local store" not in text + plan + pins
        assert bare.search(text) and "in the store" in pins


def test_a_checkpoint_is_counted_the_same_in_status_plan_and_pins(setup: Setup) -> None:
    """One count of a checkpoint's files everywhere, its directories (the store's markers)
    apart: on the node that wrote it and on a fresh one that only lists the store."""
    a = setup.node("a")
    write_checkpoints(a, range(1, 2))
    (a.mountpoint / "run1" / "step_1" / "shard").mkdir()
    (a.mountpoint / "run1" / "step_1" / "shard" / "rank0.pt").write_bytes(b"r" * 100)
    a.cli("wait", str(a.mountpoint / "run1" / "step_1"), "--timeout", "60")
    want = {"files": 3, "directories": 2}  # model.pt .metadata shard/rank0.pt; step_1/ shard/

    def counts(gw: CheckedGateway) -> list[dict[str, int]]:
        [row] = [
            c
            for c in json.loads(gw.cli("status", str(gw.mountpoint), "--json").stdout)[
                "checkpoints"
            ]
            if c["path"] == str(gw.mountpoint / "run1" / "step_1")
        ]
        [planned] = [p for p in lifecycle(gw, "plan")["plan"] if p["path"] == "run1/step_1"]
        pins = json.loads(gw.cli("pins", str(gw.mountpoint), "--json").stdout)["pins"]
        by_path = {p["path"]: p for p in pins}
        one = by_path["run1/ckpt_7.pt"]  # a checkpoint that is one file
        assert (one["files"], one["directories"]) == (1, 0), one
        return [{k: d[k] for k in want} for d in (row, planned, by_path["run1/step_1"])]

    (a.mountpoint / "run1" / "ckpt_7.pt").write_bytes(b"one file")
    a.cli("wait", str(a.mountpoint / "run1" / "ckpt_7.pt"), "--timeout", "60")
    a.cli("pin", str(a.mountpoint / "run1" / "ckpt_7.pt"))
    a.cli("pin", str(a.mountpoint / "run1" / "step_1"))
    assert counts(a) == [want, want, want]
    assert "run1/step_1  pinned " in a.cli("pins").stdout and "  3 files" in a.cli("pins").stdout
    b = setup.node("b")  # a fresh node: the checkpoint only in the store listing
    wait_for("b lists step_1", lambda: "step_1" in b.cli("status", str(b.mountpoint)).stdout, 30)
    assert counts(b) == [want, want, want]
    text = a.cli("lifecycle", "plan", str(a.mountpoint)).stdout
    assert next(ln for ln in text.splitlines() if "run1/step_1" in ln).split()[4] == "3", text
