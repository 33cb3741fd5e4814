"""Log records as JSON lines, for ``corral run --json`` (a log shipper reads them as they are)."""

from __future__ import annotations

import json
import logging


class JSONLogFormatter(logging.Formatter):
    """One JSON object per record: ``ts``, ``level``, ``logger``, ``message`` (and ``traceback``)."""

    def format(self, record: logging.LogRecord) -> str:
        line = {"ts": record.created, "level": record.levelname, "logger": record.name, "message": record.getMessage()}
        if record.exc_info:
            line["traceback"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)
