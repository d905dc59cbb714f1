# SPDX-License-Identifier: Apache-2.0
"""`python -m ckptio ...`: runs the ckptio command installed with this package."""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig


def main() -> int:
    candidates = [os.path.join(sysconfig.get_path("scripts"), "ckptio"), shutil.which("ckptio")]
    for exe in candidates:
        if exe and os.access(exe, os.X_OK):
            os.execv(exe, [exe, *sys.argv[1:]])
    print("ckptio: the ckptio command is not installed (pip install . installs it)", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
