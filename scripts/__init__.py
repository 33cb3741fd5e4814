"""Maintenance scripts: benchmarks, chaos runs and the real CLIs' captures.

A package so that the scripts import their shared helpers (``scripts._capture``,
``scripts._bench``) and the fake model servers (``tests.fakemodel``) without editing
``sys.path``: run them from the repository root as ``python -m scripts.NAME``. Not part of
the installed distribution.
"""
