# -*- Python -*-
"""lit configuration of the example's own tests (`lit -sv examples/custom_op/test`): the project's
configuration (test/lit/lit.cfg.py: FileCheck, %python, a private kernel cache), rooted here."""

import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
lit_config.load_config(config, os.path.join(here, "..", "..", "..", "test", "lit", "lit.cfg.py"))
config.name = "mori_compiler examples/custom_op"
config.suffixes = [".mlir"]
config.test_source_root = here
config.test_exec_root = here
config.substitutions.append(("%example-opt", f"{sys.executable} {os.path.join(here, '..', 'example_opt.py')}"))
