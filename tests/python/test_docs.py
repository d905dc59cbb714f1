# SPDX-License-Identifier: Apache-2.0
"""The examples in doc/python.md and in the docstrings run as written."""

from __future__ import annotations

import doctest
import importlib
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_readme_examples_run(tmp_path: pathlib.Path) -> None:
    text = (ROOT / "doc" / "python.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) >= 5
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)  # the JAX example sets it itself
    for i, code in enumerate(blocks):
        # Each run writes under its own directory: parallel runs never share /tmp/ckptio-doc.
        code = code.replace("/tmp/ckptio-doc", str(tmp_path / "doc"))
        res = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300,
            cwd=tmp_path,
        )  # fmt: skip
        assert res.returncode == 0, f"example {i + 1} failed:\n{code}\n{res.stderr}"
    assert (tmp_path / "doc").is_dir()


def test_readme_python_example_runs(tmp_path: pathlib.Path) -> None:
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks, "README.md has no Python example"
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)
    for i, code in enumerate(blocks):
        # Its checkpoints go to this test's directory, not to a fixed /tmp path.
        code = code.replace("/tmp/ckptio-readme", str(tmp_path / "readme"))
        res = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300,
            cwd=tmp_path,
        )  # fmt: skip
        assert res.returncode == 0, f"README example {i + 1} failed:\n{code}\n{res.stderr}"
    assert (tmp_path / "readme").is_dir()


@pytest.mark.parametrize(
    "module",
    ["ckptio", "ckptio._save", "ckptio._load", "ckptio._errors", "ckptio.torch", "ckptio.safetensors"],
)
def test_docstring_examples(module: str) -> None:
    mod = importlib.import_module(module)
    result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0
