# SPDX-License-Identifier: Apache-2.0
"""`make test-gpu` (tests/gpu/run.sh) where there is no GPU: the script runs once, on a
borrowed machine, with minutes to spare, so every part of it but the device itself is run here.
The plain cc build (tests/gpu/cc-build.sh) as on a machine without libcurl, the C and Python GPU
tests against the stand-in, and the bench as a dry run on CPU tensors with every phase (the
rounds, async, compression, two ranks over gloo, the targets): the summary must say each
passed, and the build must refuse s3:// saying why."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import sysconfig

import pytest

from procs import run_group

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _python_without_ckptio(where: pathlib.Path) -> pathlib.Path:
    """A Python seeing this one's packages (torch, numpy) but no installed ckptio, as on the GPU
    machine, so that the script's own build is the one tested: a venv whose .pth adds our
    site-packages as a plain directory (its .pth files, the editable ckptio's among them, are
    not run)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True,
                   timeout=120)  # fmt: skip
    py = where / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    (pathlib.Path(site) / "outer.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    probe = "import numpy, torch\ntry:\n import ckptio\nexcept ImportError:\n print('no ckptio')"
    r = subprocess.run([str(py), "-c", probe], capture_output=True, text=True, timeout=120)
    assert r.stdout.strip() == "no ckptio", r.stdout + r.stderr
    return py


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_gpu_script_end_to_end_without_a_gpu(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("torch")
    py = _python_without_ckptio(tmp_path / "venv")
    b = tmp_path / "build-gpu"
    env = {
        **os.environ,
        "GPU_RUN_FORCE": "1",
        "GPU_BUILD": str(b),
        "GPU_BUILD_WITH": "cc",
        "CKPTIO_CC_WITHOUT": "curl",
        "GPU_BENCH_DEVICE": "cpu",
        "GPU_BENCH_BYTES": str(24 << 20),
        "GPU_BENCH_RUNS": "1",
        "GPU_SUMMARY": str(tmp_path / "summary.json"),
        "PYTHON": str(py),
    }
    for k in ("OUT", "PYTHONPATH", "CKPTIO_GPU", "CKPTIO_CUDA_LIBRARY", "CKPTIO_GPU_STANDIN"):
        env.pop(k, None)
    # Its own process group, all killed past the deadline (the build, the tests, the ranks).
    rc, out = run_group([str(ROOT / "tests" / "gpu" / "run.sh")], env, 900, cwd=str(tmp_path))
    log = (b / "run.log").read_text() if (b / "run.log").exists() else ""
    assert rc == 0, out[-3000:] + log[-3000:]
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["build"] == "cc" and "object storage (libcurl) 0" in s["build_features"], s
    assert s["c_tests"] == {"standin": "pass", "real_driver": "pass"}, s
    assert s["python_tests"] == "pass", (b / "py-tests.txt").read_text()[-3000:]
    assert s["device_kind"] == "cpu" and s["all_equal"] is True and not s["failed_phases"], s
    t = s["targets"]
    for k in ("save_vs_raw", "save_vs_torch", "load_vs_raw", "host_memory", "async_stall",
              "compression", "two_ranks"):  # fmt: skip
        assert k in t, (k, t)
    assert t["save_vs_raw"]["raw_write_gbps"] > 0 and t["save_vs_raw"]["ckptio_save_gbps"] > 0
    assert t["async_stall"]["snapshot_equal"] is True
    assert t["compression"]["all"]["equal"] is True and t["compression"]["all"]["ratio"] > 1
    assert t["two_ranks"]["equal"] is True and t["two_ranks"]["met"] is True, t["two_ranks"]

    # The build without libcurl: object stores refused, saying why; files work.
    r = subprocess.run([str(b / "bin" / "ckptio"), "inspect", "s3://bucket/ckpt"],
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 1 and "built without libcurl" in r.stderr, r.stderr
    code = (
        "import ckptio, numpy as np, sys\n"
        "d = sys.argv[1]\n"
        "print('from', ckptio.__file__)\n"
        "ckptio.save({'w': np.arange(6.0)}, d)\n"
        "assert ckptio.load(d)['w'].tolist() == [0, 1, 2, 3, 4, 5]\n"
        "try:\n"
        "    ckptio.save({'w': np.arange(3)}, 'gs://bucket/ckpt')\n"
        "except ckptio.Unsupported as e:\n"
        "    print('refused:', e)\n"
    )
    r = subprocess.run([str(py), "-c", code, str(tmp_path / "ck")],
                       env={**env, "PYTHONPATH": str(b / "pkg")}, capture_output=True,
                       text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0 and "refused: gs:// URLs" in r.stdout, r.stdout + r.stderr
    assert f"from {b / 'pkg' / 'ckptio' / '__init__.py'}" in r.stdout, r.stdout
