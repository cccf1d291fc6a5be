"""The README's deployment steps as written, on a fresh copy of what a checkout holds: every line
of its block up to the image build runs and exits 0 (the build and `docker compose up` are
`make compose-test`'s), and `gpumedic init` made the secrets compose needs for the example's nodes."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GPUMEDIC = ROOT / ".venv" / "bin" / "gpumedic"


def _deploying_block() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Deploying\n", 1)[1]
    block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if line.strip()]


def test_the_readmes_deployment_steps_run_as_written_on_a_fresh_checkout(tmp_path):
    checkout = tmp_path / "gpumedic"
    shutil.copytree(ROOT / "deploy", checkout / "deploy", ignore=shutil.ignore_patterns("secrets", "*.pem", ".env"))
    shutil.copy(ROOT / "compose.yaml", checkout / "compose.yaml")
    for leftover in ("inventory.yaml", "known_hosts", "id_ed25519"):
        (checkout / "deploy" / "remediator" / leftover).unlink(missing_ok=True)  # none is committed
    ran = []
    for line in _deploying_block():
        if line in ("make install",):
            continue  # this suite runs in what it installed
        if line.startswith(("make images", "docker compose")):
            break  # make compose-test builds and starts it
        argv = shlex.split(line)
        if argv[0] == ".venv/bin/gpumedic":
            argv[0] = str(GPUMEDIC)
        result = subprocess.run(argv, cwd=checkout, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, (line, result.stdout, result.stderr)
        ran.append(argv[0])
    assert ran[-1] == str(GPUMEDIC), ran  # the init itself ran
    env = (checkout / ".env").read_text()
    assert "change-me" not in env
    nodes = sorted(p.stem for p in (checkout / "deploy" / "secrets" / "nodes").glob("*.env"))
    assert nodes, "no node credentials made from the example inventory"
