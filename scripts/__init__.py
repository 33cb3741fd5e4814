"""Maintenance scripts: benchmarks, chaos runs and the real CLIs' captures.

A package so that the scripts import their shared helpers (``scripts._capture``,
``scripts._bench``) and the doubles they share with the tests (the fake model servers in
``scripts.fakemodel``, ``scripts._postgres``, ``scripts._synapse``, ``scripts._telegram``) without
editing ``sys.path``: run them from the repository root as ``python -m scripts.NAME``. The tests
import those doubles from here; the scripts never import ``tests``. Not part of the installed
distribution.
"""
