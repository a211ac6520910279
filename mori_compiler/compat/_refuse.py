"""Stand-ins for MORI names this project deliberately does not offer: importable, and a clear error when used."""

from __future__ import annotations


def not_offered(name: str, why: str):
    """A callable named ``name`` that raises NotImplementedError(``name``: ``why``) when called."""

    def refuse(*args, **kwargs):
        raise NotImplementedError(f"{name} is not offered by mori_compiler: {why}")

    refuse.__name__ = refuse.__qualname__ = name.rsplit(".", 1)[-1]
    refuse.__doc__ = f"Not offered by mori_compiler: {why}"
    refuse.__mori_compiler_not_offered__ = why
    return refuse
