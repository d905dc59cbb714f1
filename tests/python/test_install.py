# SPDX-License-Identifier: Apache-2.0
"""Packaging: the wheel `pip install .` builds holds the package, its extension and the command."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("ninja") is None and not (pathlib.Path(sys.prefix) / "bin" / "ninja").exists(), reason="no ninja")
def test_wheel_contents(tmp_path: pathlib.Path) -> None:
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1")
    res = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-q",
         "-w", str(tmp_path), "--config-settings=build-dir=" + str(tmp_path / "build"), str(ROOT)],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    (wheel,) = tmp_path.glob("ckptio-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "ckptio/__init__.py" in names and "ckptio/torch.py" in names
    assert "ckptio/py.typed" in names
    assert any(n.startswith("ckptio/_core.") and n.endswith(".so") for n in names)
    assert any(n.endswith(".data/scripts/ckptio") for n in names), names
    # Only the package and the command: no headers, static libraries or pkg-config files.
    assert not [n for n in names if n.endswith((".h", ".a", ".pc"))], names
    # The extension is self-contained: it does not need libckptio.so.
    ext = next(n for n in names if n.startswith("ckptio/_core."))
    out = tmp_path / "x"
    zipfile.ZipFile(wheel).extract(ext, out)
    needed = subprocess.run(["readelf", "-d", str(out / ext)], capture_output=True, text=True).stdout
    assert "libckptio" not in needed


def test_python_m_ckptio_runs_the_command() -> None:
    res = subprocess.run([sys.executable, "-m", "ckptio", "--version"], capture_output=True, text=True)
    assert res.returncode == 0 and "ckptio" in res.stdout, res.stderr


def test_venv_has_the_command() -> None:
    # `make` links the built command into .venv/bin: activating .venv puts it on PATH.
    venv = ROOT / ".venv"
    if pathlib.Path(sys.prefix).resolve() != venv.resolve():
        pytest.skip("not running in the project's .venv")
    exe = venv / "bin" / "ckptio"
    assert os.access(exe, os.X_OK), f"{exe} is missing: run make"
    res = subprocess.run([str(exe), "--help"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and "usage: ckptio" in res.stdout, res.stdout + res.stderr
    res = subprocess.run([str(exe), "doctor"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and res.stdout, res.stdout + res.stderr
