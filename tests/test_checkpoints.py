"""The checkpoint model behind ``ckptgw status``: names the common trainers use, grouping, and
the durability of a checkpoint from its files'."""

from __future__ import annotations

import pytest

from ckptgw.drain.checkpoints import (
    DRAINING,
    DURABLE,
    LOCAL,
    LOCAL_ONLY,
    EntryCount,
    FileView,
    Recognizer,
)


@pytest.mark.parametrize(
    "path, checkpoint, step",
    [
        ("run1/step_100/model.pt", "run1/step_100", 100),
        ("run1/step-7/__0_0.distcp", "run1/step-7", 7),
        ("ds/global_step2000/mp_rank_00_model_states.pt", "ds/global_step2000", 2000),
        ("megatron/iter_0000100/mp_rank_00/model_optim_rng.pt", "megatron/iter_0000100", 100),
        ("hf/checkpoint-500/pytorch_model.bin", "hf/checkpoint-500", 500),
        ("lightning/epoch_3/last.ckpt", "lightning/epoch_3", 3),
        ("ckpt_42.pt", "ckpt_42.pt", 42),
        ("runs/a/ckpt-9.safetensors", "runs/a/ckpt-9.safetensors", 9),
        ("epoch_2/step_300/rank_0.pt", "epoch_2/step_300", 300),  # the deepest name wins
        ("run1/notes.txt", "run1", None),
        ("latest", "", None),
        ("run1/stepper/x.pt", "run1/stepper", None),
    ],
)
def test_checkpoint_names(path: str, checkpoint: str, step: int | None) -> None:
    assert Recognizer().locate(path) == (checkpoint, step)


def test_grouping_state_and_order() -> None:
    files = [
        FileView("run/step_1/a.pt", 10, DURABLE, 100.0),
        FileView("run/step_1/b.pt", 20, DURABLE, 101.0),
        FileView("run/step_2/a.pt", 10, DURABLE, 200.0),
        FileView("run/step_2/b.pt", 20, LOCAL, 201.0),
        FileView("run/step_3/a.pt", 10, LOCAL, 300.0),
        FileView("run/step_4/a.pt", 10, DRAINING, 400.0),
        FileView("run/step_4/b.pt", 10, LOCAL, 401.0),
        FileView("run/log.txt", 5, LOCAL, 50.0),
    ]
    groups = Recognizer().group(files)
    assert [(g.path, g.state) for g in groups] == [
        ("run/step_4", DRAINING),
        ("run/step_3", LOCAL_ONLY),
        ("run/step_2", DRAINING),  # partly in the store: still not safe
        ("run/step_1", DURABLE),
        ("run", LOCAL_ONLY),
    ]
    step_2 = groups[2]
    assert (step_2.step, step_2.bytes, step_2.local_bytes, step_2.mtime) == (2, 30, 20, 201.0)


def test_custom_patterns() -> None:
    r = Recognizer([r"save(\d+)"])
    assert r.locate("x/save12/m.pt") == ("x/save12", 12)
    assert r.locate("x/step_12/m.pt") == ("x/step_12", None)  # only the configured names


@pytest.mark.parametrize(
    ("root", "paths", "files", "directories"),
    [
        # what this node knows (files only) and what a listing names (markers too) agree
        ("run/step_1", ["run/step_1/a.pt", "run/step_1/sub/b.pt"], 2, 2),
        ("run/step_1",
         ["run/step_1/", "run/step_1/a.pt", "run/step_1/sub/", "run/step_1/sub/b.pt"], 2, 2),
        ("run/step_1", ["run/step_1/deep/er/c.pt"], 1, 3),  # no markers: from the path
        ("run/step_1", ["run/step_1/", "run/step_1/empty/"], 0, 2),  # only directories
        ("run/ckpt_5.pt", ["run/ckpt_5.pt"], 1, 0),  # a checkpoint that is one file
        ("run", ["run/", "run/", "run/notes.txt"], 1, 1),  # a directory named twice
        ("", ["a.txt", "b.txt"], 2, 0),  # the root's files: the root is no directory here
        ("run/step_1", ["run/", "run/step_1/x.pt"], 1, 1),  # a directory above it: not its own
    ],
)  # fmt: skip
def test_entries_are_counted_one_way(
    root: str, paths: list[str], files: int, directories: int
) -> None:
    assert EntryCount.of(root, paths) == EntryCount(files, directories)
