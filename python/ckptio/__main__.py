# SPDX-License-Identifier: Apache-2.0
"""`python -m ckptio ...`: runs the ckptio command installed with this package."""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig


def main() -> int:
    from . import _core

    # Installed next to this Python, on PATH, or (editable installs) in the build directory.
    build = os.path.dirname(os.path.dirname(os.path.abspath(_core.__file__)))
    candidates = [
        os.path.join(sysconfig.get_path("scripts"), "ckptio"),
        shutil.which("ckptio"),
        os.path.join(build, "tools", "ckptio"),
    ]
    # `ckptio convert` hands torch and DCP conversions back to this Python.
    os.environ.setdefault("CKPTIO_PYTHON", sys.executable)
    for exe in candidates:
        if exe and os.access(exe, os.X_OK):
            os.execv(exe, [exe, *sys.argv[1:]])
    print("ckptio: the ckptio command is not installed (pip install . installs it)", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
