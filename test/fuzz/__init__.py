"""Mutation fuzzing of ``mori-opt`` and ``mori-compile`` (see README.md in this folder).

Modules, one concern each:
  corpus      seed inputs: the lit inputs, the built-in examples, EP modules, precompile config lists
  mutators    seeded byte-, line- and MLIR-token-level mutators
  json_mutators  mutators of ``--precompile`` config lists
  argv_mutators  mutators of command lines (pipelines, pass options, compile options)
  executor    run a CLI on one input: a fork server (fast) or a fresh subprocess (reference)
  classify    outcome classes of a run and the signature failures are deduplicated by
  reduce      delta debugging of a failing input (lines, then bytes), bounded in time
  campaign    generate mutants, run them, collect counts, write minimized reproducers
  run         the command line (``python test/fuzz/run.py`` or ``PYTHONPATH=test python -m fuzz``)
  findings    append reproducer folders to a shared Markdown findings file

Imported as the top-level package ``fuzz`` with ``test/`` on ``sys.path`` (``test`` itself would be the
standard library's regression-test package).
"""
