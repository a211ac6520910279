"""``mori-opt`` with the ``mori_example`` dialect and its pass registered (the lit test's tool).

    python examples/custom_op/example_opt.py input.mlir -p 'mori-example-to-shmem'

Every option of mori-opt works (``--list-passes`` shows the example's pass, ``--show-dialects`` its dialect).
"""

import sys

import mori_example

from mori_compiler.tools import opt

if __name__ == "__main__":
    mori_example.register()
    sys.exit(opt.entry())
