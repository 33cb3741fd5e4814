"""The ``corral`` console script: ``corral --version`` answers without importing click.

Everything else is :func:`supervisor.cli.main`. The version is what a packager, a bug report
or a health check asks first and most often, so it costs the interpreter's start-up and one
small file read (``supervisor._version``), nothing more.
"""

from __future__ import annotations

import sys


def main() -> None:
    """Run the ``corral`` command line."""
    if sys.argv[1:] == ["--version"]:
        import supervisor

        sys.stdout.write(f"corral {supervisor.__version__}\n")
        return
    from .cli import main as cli

    cli()
