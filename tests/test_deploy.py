"""deploy/ as shipped: shell scripts pass shellcheck and really mount, flush and unmount a
gateway; the YAML carries the fields a cluster depends on (asserted, not just loaded); the
systemd unit passes ``systemd-analyze verify``; the Dockerfile builds what the DaemonSet runs;
and every ``ckptgw`` command any of them runs parses with the real CLI."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from ckptgw.gateway.cli.main import _parser
from ckptgw.gateway.config import Config, load_config
from ckptgw.gateway.harness import Gateway

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
SCRIPTS = sorted((DEPLOY / "slurm").glob("*.sh"))


def parse_cli(argv: list[str]) -> Any:
    """What the CLI makes of ``argv`` (the words after ``ckptgw``); argparse exits on a bad one."""
    try:
        return _parser().parse_args(argv)
    except SystemExit as e:
        raise AssertionError(f"ckptgw {shlex.join(argv)}: not accepted by the CLI") from e


def yaml_docs(name: str) -> dict[str, dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all((DEPLOY / "kubernetes" / name).read_text()) if d]
    return {d["kind"]: d for d in docs}


# -- shell ---------------------------------------------------------------------------------------


def test_shell_scripts_pass_shellcheck() -> None:
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed (make test installs it with apt-get)")
    files = [*SCRIPTS, DEPLOY / "slurm" / "ckptgw.env"]
    r = subprocess.run(
        ["shellcheck", "-x", "--shell=bash", "--severity=style", *map(str, files)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    for script in SCRIPTS:
        assert os.access(script, os.X_OK), f"{script.name} is not executable"
        assert script.read_text().startswith("#!/bin/bash\n")


def ckptgw_calls(script: Path, values: dict[str, str]) -> list[list[str]]:
    """Every ``"$CKPTGW" ...`` command in a script, its variables filled in."""
    calls = []
    for m in re.finditer(r'"\$CKPTGW" (.*?)(?: \d?>|\)|$)', script.read_text(), re.M):
        words = m.group(1)
        for var, value in values.items():
            words = words.replace(f'"${var}"', value)
        assert "$" not in words, f"{script.name}: unfilled variable in {words!r}"
        calls.append(shlex.split(words))
    return calls


def test_slurm_scripts_call_real_cli_commands() -> None:
    values = {
        "MOUNTPOINT": "/mnt/ckpt",
        "CONFIG": "/etc/ckptgw/ckptgw.toml",
        "target": "/mnt/ckpt/u",
        "TIMEOUT": "600",
    }
    prolog = ckptgw_calls(DEPLOY / "slurm/prolog.sh", values)
    epilog = ckptgw_calls(DEPLOY / "slurm/epilog.sh", values)
    assert [c[0] for c in prolog] == ["status", "mount"]
    assert [c[0] for c in epilog] == ["status", "flush", "umount"]
    for argv in prolog + epilog:
        parse_cli(argv)
    assert parse_cli(prolog[1]).allow_other is True  # jobs run as their user
    flush = parse_cli(epilog[1])
    assert flush.wait and flush.timeout == 600
    assert not parse_cli(epilog[2]).force  # never drop undrained data at the end of a job


@pytest.mark.mount
def test_slurm_prolog_mounts_and_epilog_flushes_and_unmounts(tmp_path: Path) -> None:
    """The scripts as shipped, run the way slurmd runs them (root, SLURM_* set), against a real
    gateway on a file store: mount, a per-user directory, a checkpoint, the flush, the unmount."""
    mnt, cache, store = tmp_path / "mnt", tmp_path / "cache", tmp_path / "store"
    config = tmp_path / "ckptgw.toml"
    config.write_text(
        f'[store]\nurl = "file://{store}"\nallow_local = true\n[cache]\ndir = "{cache}"\n'
        "[drain]\nsettle = 600.0\n"
    )  # a store in a temp dir, on purpose; only the epilog's flush drains
    wrapper = tmp_path / "ckptgw"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} -m ckptgw.gateway.cli "$@"\n')
    wrapper.chmod(0o755)
    env_file = tmp_path / "slurm.env"
    env_file.write_text(
        (DEPLOY / "slurm/ckptgw.env").read_text()
        + f"CKPTGW_MOUNTPOINT={mnt}\nCKPTGW_CONFIG={config}\nCKPTGW={wrapper}\n"
        "CKPTGW_EPILOG_TIMEOUT=60\nCKPTGW_UMOUNT_AFTER_JOB=1\n"
    )
    env = dict(
        os.environ,
        CKPTGW_ENV=str(env_file),
        CKPTGW_RUNTIME_DIR=str(tmp_path / "run"),
        SLURM_JOB_ID="42",
        SLURM_JOB_USER="nobody",
        PYTHONPATH=str(ROOT),
    )
    cleanup = Gateway(
        mnt, cache, f"file://{store}", env={"CKPTGW_RUNTIME_DIR": env["CKPTGW_RUNTIME_DIR"]}
    )

    def run(script: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(DEPLOY / "slurm" / script)],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    try:
        r = run("prolog.sh")
        assert r.returncode == 0, r.stderr
        entry = cleanup._entry()
        assert entry is not None, "the prolog did not mount"
        cleanup.pid = entry.pid
        userdir = mnt / "nobody"
        assert userdir.stat().st_uid == int(subprocess.check_output(["id", "-u", "nobody"]))
        assert run("prolog.sh").returncode == 0  # a second job on the node: still one gateway
        again = cleanup._entry()
        assert again is not None and again.pid == entry.pid
        (userdir / "step_1").mkdir()
        (userdir / "step_1" / "model.pt").write_bytes(b"weights" * 1000)
        assert not (store / "nobody/step_1/model.pt").exists()  # settle 600: nothing drained yet

        r = run("epilog.sh")
        assert r.returncode == 0, r.stderr
        assert (store / "nobody/step_1/model.pt").read_bytes() == b"weights" * 1000
        assert cleanup._entry() is None, "CKPTGW_UMOUNT_AFTER_JOB=1 did not unmount"
        assert str(mnt) not in Path("/proc/self/mounts").read_text()
        r = run("epilog.sh")  # no gateway: nothing to do, and never a failing epilog
        assert r.returncode == 0
    finally:
        cleanup.stop()


def test_slurm_prolog_fails_the_job_when_it_cannot_mount(tmp_path: Path) -> None:
    env_file = tmp_path / "slurm.env"
    env_file.write_text(
        f"CKPTGW_MOUNTPOINT={tmp_path / 'mnt'}\nCKPTGW_CONFIG={tmp_path / 'no.toml'}\n"
        f"CKPTGW={tmp_path / 'ckptgw'}\n"
    )
    wrapper = tmp_path / "ckptgw"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} -m ckptgw.gateway.cli "$@"\n')
    wrapper.chmod(0o755)
    env = dict(
        os.environ,
        CKPTGW_ENV=str(env_file),
        CKPTGW_RUNTIME_DIR=str(tmp_path / "run"),
        PYTHONPATH=str(ROOT),
    )
    r = subprocess.run(
        [str(DEPLOY / "slurm/prolog.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 1  # slurmd drains the node and requeues the job
    assert str(tmp_path / "mnt") not in Path("/proc/self/mounts").read_text()


# -- Kubernetes ----------------------------------------------------------------------------------


def test_daemonset_carries_what_the_cluster_depends_on() -> None:
    docs = yaml_docs("daemonset.yaml")
    assert {"Namespace", "ServiceAccount", "ConfigMap", "DaemonSet"} <= set(docs)
    ds = docs["DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    assert (
        ds["spec"]["selector"]["matchLabels"].items()
        <= ds["spec"]["template"]["metadata"]["labels"].items()
    )
    (c,) = pod["containers"]
    assert c["securityContext"]["privileged"] is True
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}

    # the gateway's arguments, read with the real CLI and the real config loader
    assert c.get("command") is None  # the image's ENTRYPOINT is ckptgw (checked below)
    args = parse_cli(c["args"])
    assert args.command == "mount" and args.foreground
    mnt = mounts[args.mountpoint]
    assert mnt["mountPropagation"] == "Bidirectional"
    assert volumes[mnt["name"]]["hostPath"]["path"] == args.mountpoint
    cfg_mount = mounts[str(Path(args.config).parent)]
    cm_name = volumes[cfg_mount["name"]]["configMap"]["name"]
    assert docs["ConfigMap"]["metadata"]["name"] == cm_name
    toml_text = docs["ConfigMap"]["data"][Path(args.config).name]
    assert "privileged" not in toml_text

    # the config itself loads, and its cache dir is the hostPath on the node's NVMe
    cfg = _load_toml_text(toml_text, args.mountpoint)
    assert "hostPath" in volumes[mounts[str(cfg.cache_dir)]["name"]]
    assert cfg.allow_other, "training pods run as other users"
    assert volumes["fuse"]["hostPath"] == {"path": "/dev/fuse", "type": "CharDevice"}
    assert mounts["/dev/fuse"]["name"] == "fuse"
    env = {e["name"]: e for e in c["env"]}
    assert "CKPTGW_RUNTIME_DIR" in env and env["CKPTGW_RUNTIME_DIR"]["value"] in mounts

    # stopping: the preStop flush plus the SIGTERM drain fit in the grace period
    pre = c["lifecycle"]["preStop"]["exec"]["command"]
    assert pre[0] == "ckptgw"
    flush = parse_cli(pre[1:])
    assert flush.command == "flush" and flush.wait and flush.paths == [args.mountpoint]
    assert pod["terminationGracePeriodSeconds"] >= flush.timeout + cfg.shutdown_deadline + 10

    # readiness and liveness: status of this mount
    for probe in ("readinessProbe", "livenessProbe"):
        cmd = c[probe]["exec"]["command"]
        assert cmd[0] == "ckptgw"
        st = parse_cli(cmd[1:])
        assert st.command == "status" and st.mountpoint == args.mountpoint

    # credentials: from the Secret when it exists (optional), never literal in the manifest
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        ref = env[key]["valueFrom"]["secretKeyRef"]
        assert ref["optional"] is True and "value" not in env[key]
    secret = yaml_docs("secret.example.yaml")["Secret"]
    refs = {e["valueFrom"]["secretKeyRef"]["name"] for e in c["env"] if "valueFrom" in e}
    assert refs == {secret["metadata"]["name"]}
    assert secret["metadata"]["namespace"] == ds["metadata"]["namespace"]
    keys = {e["valueFrom"]["secretKeyRef"]["key"] for e in c["env"] if "valueFrom" in e}
    assert keys == set(secret["stringData"])
    assert pod["serviceAccountName"] == docs["ServiceAccount"]["metadata"]["name"]
    assert pod["priorityClassName"] == "system-node-critical"
    assert cfg.metrics_listen is not None
    assert int(c["ports"][0]["containerPort"]) == cfg.metrics_listen[1]


def _load_toml_text(text: str, mountpoint: str) -> Config:
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".toml") as f:
        f.write(text)
        f.flush()
        return load_config(mountpoint, config_file=f.name)


def test_training_job_sees_the_gateway_mount() -> None:
    ds = yaml_docs("daemonset.yaml")["DaemonSet"]["spec"]["template"]["spec"]
    job = yaml_docs("training-job.yaml")["Job"]
    pod = job["spec"]["template"]["spec"]
    host_mnt = next(v["hostPath"]["path"] for v in ds["volumes"] if v["name"] == "mnt")
    ckpt = {v["name"]: v for v in pod["volumes"]}
    for c in [*pod["initContainers"], *pod["containers"]]:
        (m,) = c["volumeMounts"]
        assert m["mountPropagation"] == "HostToContainer"  # sees the mount, and a remount
        assert ckpt[m["name"]]["hostPath"]["path"] == host_mnt
    # it runs only where the gateway runs, and waits for the mount (fuse.ckptgw) to be there
    assert pod["nodeSelector"].items() <= ds["nodeSelector"].items()
    assert "fuse.ckptgw" in " ".join(pod["initContainers"][0]["command"])
    assert pod["restartPolicy"] == "OnFailure" and job["spec"]["backoffLimit"] > 0


# -- systemd -------------------------------------------------------------------------------------


def unit(name: str = "ckptgw@.service") -> dict[str, list[str]]:
    fields: dict[str, list[str]] = {}
    for line in (DEPLOY / "systemd" / name).read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            k, v = line.split("=", 1)
            fields.setdefault(k, []).append(v)
    return fields


def test_systemd_unit_fields_and_commands() -> None:
    u = unit()
    assert u["Type"] == ["notify"] and u["Restart"] == ["on-failure"]
    assert "network-online.target" in u["After"][0] and u["RequiresMountsFor"]
    (start,) = u["ExecStart"]
    (stop,) = u["ExecStop"]
    words = start.replace("%f", "/mnt/ckpt").replace("%i", "mnt-ckpt").split()
    assert words[0] == "/usr/local/bin/ckptgw"
    args = parse_cli(words[1:])
    assert args.command == "mount" and args.foreground and args.mountpoint == "/mnt/ckpt"
    stop_args = parse_cli(stop.replace("%f", "/mnt/ckpt").split()[1:])
    assert stop_args.command == "umount" and stop_args.force
    cfg = load_config("/mnt/ckpt", config_file=str(DEPLOY / "systemd/ckptgw.toml.example"))
    # ExecStop's drain, then SIGTERM's, within the stop timeout
    assert int(u["TimeoutStopSec"][0]) >= stop_args.timeout + cfg.shutdown_deadline + 10


def test_nfs_units_serve_the_mount_of_their_instance(tmp_path: Path) -> None:
    from ckptgw.gateway.nfs.export import load_export

    u = unit("ckptgw-nfs@.service")
    assert u["BindsTo"] == ["ckptgw@%i.service"] and "ckptgw@%i.service" in u["After"][0]
    assert u["Type"] == ["notify"]  # serve nfs --foreground reports readiness to systemd
    (start,) = u["ExecStart"]
    args = parse_cli(start.replace("%f", "/mnt/ckpt").replace("%i", "mnt-ckpt").split()[1:])
    assert (args.command, args.protocol, args.foreground) == ("serve", "nfs", True)
    # the example config, with its [mount] and [nfs] lines as a gateway node uncomments them
    example = (DEPLOY / "systemd/ckptgw.toml.example").read_text()
    node = re.sub(r"^# (\[nfs\]|clients|export)", r"\1", example, flags=re.M)
    node = node.replace("allow_other = false", "allow_other = true")
    cfg_file = tmp_path / "mnt-ckpt.toml"
    cfg_file.write_text(node)
    cfg = load_config("/mnt/ckpt", config_file=str(cfg_file))
    export = load_export(Path("/mnt/ckpt"), str(cfg_file))
    assert cfg.allow_other and export.clients == ("10.0.0.0/16",)

    docs = yaml_docs("nfs-gateway.yaml")
    sts = docs["StatefulSet"]["spec"]["template"]["spec"]
    (c,) = sts["containers"]
    script = c["args"][0]
    mount_cmd, serve_cmd = (part.strip() for part in script.split("&&"))
    env = {e["name"]: e["value"] for e in c["env"]}
    for var, value in env.items():
        mount_cmd = mount_cmd.replace(f'"${var}"', value)
        serve_cmd = serve_cmd.replace(f'"${var}"', value)
    m = parse_cli(shlex.split(mount_cmd)[1:])
    assert m.command == "mount" and m.allow_other
    s = parse_cli(shlex.split(serve_cmd.removeprefix("exec "))[1:])
    assert (s.command, s.foreground, s.mountpoint) == ("serve", True, m.mountpoint)
    assert load_export(Path(s.mountpoint), clients=s.clients, protocols=s.protocols).protocols == (
        4,
    )
    stop = parse_cli(c["lifecycle"]["preStop"]["exec"]["command"][1:])
    assert stop.command == "umount" and stop.mountpoint == m.mountpoint
    assert docs["PersistentVolume"]["spec"]["nfs"]["server"] == docs["Service"]["spec"]["clusterIP"]
    assert docs["PersistentVolume"]["spec"]["nfs"]["path"] == "/checkpoints"


def test_systemd_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed on this machine")
    exe = Path(sys.executable).parent / "ckptgw"
    assert exe.exists(), "the ckptgw entry point is not installed"
    # The unit as shipped, with ExecStart/ExecStop pointing at this checkout's ckptgw.
    text = (DEPLOY / "systemd/ckptgw@.service").read_text()
    (tmp_path / "ckptgw@.service").write_text(text.replace("/usr/local/bin/ckptgw", str(exe)))
    r = subprocess.run(
        ["systemd-analyze", "verify", str(tmp_path / "ckptgw@mnt-ckpt.service")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0 and not r.stderr.strip() and not r.stdout.strip(), r.stderr


# -- container -----------------------------------------------------------------------------------


def dockerfile() -> list[tuple[str, str]]:
    text = (DEPLOY / "docker/Dockerfile").read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            op, _, rest = line.strip().partition(" ")
            out.append((op.upper(), rest.strip()))
    return out


def test_dockerfile_builds_the_daemon_the_daemonset_runs() -> None:
    import json

    ins = dockerfile()
    stages = [i for i, (op, _) in enumerate(ins) if op == "FROM"]
    assert len(stages) == 2
    final = ins[stages[-1] :]
    assert all("python:3.11" in rest for op, rest in ins if op == "FROM")
    runs = " ".join(rest for op, rest in final if op == "RUN")
    assert "fuse3" in runs  # fusermount3 in the image that runs
    assert "torch" not in " ".join(rest for _, rest in ins if _ == "RUN")
    for op, rest in ins:
        if op == "COPY" and not rest.startswith("--from"):
            for src in rest.split()[:-1]:
                assert (ROOT / src).exists(), f"COPY {src}: not in the repository"
    entry = json.loads(next(rest for op, rest in final if op == "ENTRYPOINT"))
    cmd = json.loads(next(rest for op, rest in final if op == "CMD"))
    assert entry == ["ckptgw"]
    args = parse_cli(cmd)
    assert args.command == "mount" and args.foreground
    assert ("STOPSIGNAL", "SIGTERM") in final
    # The DaemonSet's config path is the image's default one.
    ds_args = yaml_docs("daemonset.yaml")["DaemonSet"]["spec"]["template"]["spec"]["containers"][0]
    assert parse_cli(ds_args["args"]).config == args.config
    assert ".venv" in (ROOT / ".dockerignore").read_text().split()


def test_docs_have_a_page_with_the_failure_story_for_each() -> None:
    for page in ("systemd", "kubernetes", "slurm", "container", "nfs"):
        text = (ROOT / "docs/deploy" / f"{page}.md").read_text()
        assert "## What happens to dirty data" in text, page
        # every deploy file a page links to exists
        for link in re.findall(r"\]\((\.\./\.\./deploy/[^)]+)\)", text):
            assert (ROOT / "docs/deploy" / link).resolve().exists(), f"{page}.md: {link}"
