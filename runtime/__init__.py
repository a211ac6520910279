"""See the package docstring of mori_compiler for the layering rules."""
