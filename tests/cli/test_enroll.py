"""`gpumedic enroll`'s parts that need no node: which wheels fit a node, what a node's answers
mean, the credentials written for it, the files it gets. The whole flow runs against a container
shaped like a rented pod in tests/pods (`make pods-test`)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from gpumedic.enroll import NODE_FILES, Credentials, EnrollError, NodeFacts
from gpumedic.enroll.artifact import ArtifactError, Platform
from gpumedic.inventory_sync import set_node_setting
from gpumedic_nodes.inventory import load_inventory


def test_a_platform_is_what_the_node_printed_and_refuses_what_no_wheel_fits():
    platform = Platform.of("x86_64\n", "3.12", "glibc-2.35")
    assert platform == Platform("x86_64", (3, 12), (2, 35)) and platform.tag == "cp312-x86_64-glibc2.35"
    options = platform.pip_options()
    assert "--only-binary=:all:" in options and options[options.index("--python-version") + 1] == "3.12"
    platforms = [options[i + 1] for i, o in enumerate(options) if o == "--platform"]
    assert platforms[0] == "manylinux_2_35_x86_64" and "manylinux_2_17_x86_64" in platforms and "manylinux_2_16_x86_64" not in platforms
    assert Platform.of("arm64", "3.11", "glibc-2.39").arch == "aarch64"
    for args, why in [
        (("riscv64", "3.11", "glibc-2.36"), "CPU riscv64: wheels exist for x86_64 and aarch64 only"),
        (("x86_64", "3.10", "glibc-2.35"), "python3 is 3.10; node-sampler needs 3.11 or newer"),
        (("x86_64", "3.11", "-"), "C library -: the wheels need glibc"),
        (("x86_64", "3.11", "glibc-2.12"), "glibc 2.12 is older than 2.17"),
        (("x86_64", "three", "glibc-2.36"), "python3 printed 'three' as its version"),
    ]:
        with pytest.raises(ArtifactError, match=why.replace("(", r"\(").replace(")", r"\)")):
            Platform.of(*args)


def test_the_node_answers_decide_the_supervisor_and_a_node_without_python_says_so():
    answer = "home=/root\nuser=root\nuid=0\nmachine=x86_64\npython=/usr/bin/python3\npyver=3.11\nlibc=glibc-2.36\nfree_kb=10485760\n"
    facts = NodeFacts.parse(answer)
    assert (facts.manager, facts.free_mb, facts.installed) == ("supervisor", 10240, None)  # a pod: root, no systemd
    assert NodeFacts.parse(answer + "systemd=yes\n").manager == "systemd"
    assert NodeFacts.parse(answer.replace("uid=0", "uid=1000") + "systemd=yes\n").manager == "supervisor"  # no unit without root
    assert NodeFacts.parse(answer + "installed=0.1.0+abc\n").installed == "0.1.0+abc"
    with pytest.raises(EnrollError, match=r"no python3 on the node \(install python3, 3.11 or newer\)"):
        NodeFacts.parse(answer.replace("python=/usr/bin/python3", "python="))
    # what a node answers goes into commands, a unit file, the inventory and the terminal: each in its form
    with pytest.raises(EnrollError, match=r"the node answered home='/root/\$\(id\)' \(11 characters\), which is not a plain absolute path; not enrolled"):
        NodeFacts.parse(answer.replace("home=/root", "home=/root/$(id)"))
    with pytest.raises(EnrollError, match="the node answered home='relative' .* which is not a plain absolute path"):
        NodeFacts.parse(answer.replace("home=/root", "home=relative"))
    with pytest.raises(EnrollError, match="the node answered uid='zero' .* which is not a user id of at most 10 digits"):
        NodeFacts.parse(answer.replace("uid=0", "uid=zero"))


@pytest.mark.parametrize(
    ("key", "value", "form"),
    [
        ("uid", "9" * 5000, "a user id of at most 10 digits"),  # int() of it raised a ValueError nothing caught
        ("free_kb", "1" * 5000, "a count of KiB of at most 19 digits"),
        ("user", "root\x1b]0;owned\x07", "a user name"),
        ("installed", "\x1b[2J0.1.0", "a version"),
        ("machine", "x86_64; reboot", "a machine name such as x86_64"),
        ("pyver", "3.11\x1b[31m", "a Python version such as 3.11"),
    ],
)
def test_a_node_answer_out_of_its_form_is_refused_by_name_and_shown_escaped(key, value, form):
    answer = "home=/root\nuser=root\nuid=0\nmachine=x86_64\npython=/usr/bin/python3\npyver=3.11\nlibc=glibc-2.36\nfree_kb=10485760\n"
    lines = [line for line in answer.splitlines() if not line.startswith(f"{key}=")] + [f"{key}={value}"]
    with pytest.raises(EnrollError) as caught:
        NodeFacts.parse("\n".join(lines))
    said = str(caught.value)
    assert said.startswith(f"the node answered {key}=") and f"which is not {form}; not enrolled" in said
    assert "\x1b" not in said and "\x07" not in said and len(said) < 200


def test_the_node_gets_its_own_credentials_with_the_ca_where_enroll_puts_it(tmp_path):
    (tmp_path / "nodes").mkdir()
    (tmp_path / "nodes" / "gpu-7.env").write_text(
        "# written by gpumedic init\nGPUMEDIC_SAMPLER_NODE_ID=gpu-7\nGPUMEDIC_NATS_URL=tls://nats:4222\n"
        "GPUMEDIC_NATS_USER=node-gpu-7\nGPUMEDIC_NATS_PASSWORD=a'b$c\nGPUMEDIC_NATS_TLS_CA_FILE=/run/secrets/ca.pem\n")
    env = Credentials(tmp_path, nats_url="tls://gpumedic.example:4222").node_env("gpu-7", "/home/u/.gpumedic/ca.pem").decode()
    assert env.splitlines() == [
        "GPUMEDIC_SAMPLER_NODE_ID=gpu-7", "GPUMEDIC_NATS_URL=tls://gpumedic.example:4222", "GPUMEDIC_NATS_USER=node-gpu-7",
        "GPUMEDIC_NATS_PASSWORD='a'\"'\"'b$c'", "GPUMEDIC_NATS_TLS_CA_FILE=/home/u/.gpumedic/ca.pem",
    ]
    # the node's shell reads it back as written (the control script sources it)
    done = subprocess.run(["sh", "-c", 'set -a; . /dev/stdin; printf %s "$GPUMEDIC_NATS_PASSWORD"'], input=env, capture_output=True, text=True)
    assert done.stdout == "a'b$c"
    with pytest.raises(EnrollError, match=r"nodes/gpu-8.env cannot be read .*`gpumedic init --node gpu-8` writes them"):
        Credentials(tmp_path).node_env("gpu-8", "/ca.pem")
    (tmp_path / "nodes" / "gpu-8.env").write_text("GPUMEDIC_SAMPLER_NODE_ID=gpu-7\n")
    with pytest.raises(EnrollError, match=r"gpu-8.env is for node 'gpu-7', not 'gpu-8'"):
        Credentials(tmp_path).node_env("gpu-8", "/ca.pem")
    (tmp_path / "nodes" / "gpu-8.env").write_text("export X=1 && rm -rf /\n")
    with pytest.raises(EnrollError, match=r"gpu-8.env line 1 is not KEY=VALUE"):
        Credentials(tmp_path).node_env("gpu-8", "/ca.pem")


def test_the_systemd_unit_passes_systemd_analyze_verify(tmp_path):
    home = tmp_path / "root"
    control = home / ".gpumedic" / "bin" / "gpumedic-node"
    control.parent.mkdir(parents=True)
    shutil.copyfile(NODE_FILES / "gpumedic-node", control)
    control.chmod(0o700)
    unit = tmp_path / "gpumedic-node-sampler.service"
    unit.write_text((NODE_FILES / "gpumedic-node-sampler.service").read_text().replace("@DIR@", str(home / ".gpumedic")))
    done = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True)
    problems = [line for line in done.stderr.splitlines() if "gpumedic-node-sampler.service" in line]
    assert done.returncode == 0 and not problems, done.stderr


def test_the_control_script_is_plain_sh_and_takes_only_a_program_name(tmp_path):
    assert subprocess.run(["sh", "-n", str(NODE_FILES / "gpumedic-node")]).returncode == 0
    home = tmp_path / ".gpumedic"
    (home / "bin").mkdir(parents=True)
    control = home / "bin" / "gpumedic-node"
    shutil.copyfile(NODE_FILES / "gpumedic-node", control)
    control.chmod(0o700)
    (home / "python").write_text("python3\n")
    (home / "manager").write_text("supervisor\n")
    for hostile in ["x;reboot", "../../etc", "$(id)", ""]:
        done = subprocess.run([str(control), "restart", hostile], capture_output=True, text=True)
        assert done.returncode == 2 and "not a program name" in done.stderr, (hostile, done.stderr)
    usage = subprocess.run([str(control)], capture_output=True, text=True)
    assert usage.returncode == 2 and "gpumedic-node restart PROGRAM" in usage.stderr


def test_enroll_records_the_supervisor_in_the_inventory_and_keeps_the_rest(tmp_path):
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text("# our fleet\nnodes:\n  pod-1: {host: 10.0.0.9, port: 22107}  # RunPod\n  gpu-2: {host: 10.0.0.7}\n")
    assert set_node_setting(inventory, "pod-1", "service_manager", "supervisor") is True
    assert set_node_setting(inventory, "pod-1", "service_manager", "supervisor") is False
    assert load_inventory(inventory)["pod-1"].service_manager == "supervisor"
    assert load_inventory(inventory)["gpu-2"].service_manager == "systemd"
    assert "# our fleet" in inventory.read_text() and "# RunPod" in inventory.read_text()
    assert set_node_setting(inventory, "pod-1", "service_manager", None) is True
    assert "service_manager" not in inventory.read_text()
    from gpumedic_nodes.inventory import InventoryError

    with pytest.raises(InventoryError, match="unknown node 'nope'"):
        set_node_setting(inventory, "nope", "service_manager", "supervisor")
    with pytest.raises(InventoryError, match="would not load, so it was not written"):
        set_node_setting(inventory, "gpu-2", "service_manager", "launchd")
    for hostile in ["workspace/.gpumedic", "/workspace/../etc", "/tmp/$(id)", "/a b"]:
        with pytest.raises(InventoryError, match="gpumedic_dir"):
            set_node_setting(inventory, "gpu-2", "gpumedic_dir", hostile)
    assert Path(inventory).read_text().count("service_manager") == 0
