"""`make test` on a machine without the Debian packages the tests need: as a user who cannot install
them, it stops at once with the one command to run (rather than skip the tests that need them)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("debian-packages.sh")


@pytest.mark.skipif(not shutil.which("runuser"), reason="needs runuser to act as an unprivileged user")
def test_a_user_without_the_packages_is_told_the_one_command_to_run():
    # As nobody with an empty PATH: gcc, npm, systemd-analyze and prometheus are not found, so the script must name them (it
    # reads the script on stdin: nobody may not open files under the tests' temporary folders).
    with SCRIPT.open() as script:
        result = subprocess.run(["runuser", "-u", "nobody", "--", "/usr/bin/env", "PATH=/nonexistent", "/bin/bash", "-s"],
                                stdin=script, capture_output=True, text=True, timeout=30)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "the tests need these Debian packages: gcc libc6-dev nodejs npm systemd prometheus" in result.stderr
    assert "run: sudo apt-get install -y --no-install-recommends gcc libc6-dev nodejs npm systemd prometheus" in result.stderr


def test_with_everything_installed_it_says_nothing_and_succeeds():
    result = subprocess.run(["/bin/bash", str(SCRIPT)], capture_output=True, text=True, timeout=30)
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")
