"""Run a command, pass its output through, then print `exit status: N` and exit 0.

Used as `%exit-status <cmd> ... 2>&1 | FileCheck %s` to pin the exact exit code of a tool (`not` only
says "non-zero"); a FileCheck line `CHECK: exit status: 1` then fails on any other code.
"""

import subprocess
import sys

status = subprocess.run(sys.argv[1:]).returncode
sys.stdout.flush()
print(f"exit status: {status}", flush=True)
