"""Measured timings kept between runs (estimate.py's training steps, forward passes, model builds and
data generation), one table per machine: the device's hardware, the torch threads and the versions of
torch and tmem-bench, since each changes the time a step takes. A shape is measured once on a
machine; later estimates of it read the table, so a second dry run takes seconds and does not swing
with the load of the moment. Deleting the file measures again."""
from __future__ import annotations

import json

from ..files import cache_root, write_json

FILE = "step_timings.json"


class Timings:
    def __init__(self, machine: str, path=None):
        self.machine = machine
        self.path = path or cache_root() / FILE
        self.stored: dict[str, object] = self._read().get(machine, {})
        self.new: dict[str, object] = {}
        self.reused = 0  # values read from the table

    def _read(self) -> dict:
        # Only a regular file is opened (a FIFO would block); an unreadable or edited one is measured anew.
        try:
            data = json.loads(self.path.read_text("utf-8")) if self.path.is_file() else {}
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) and all(isinstance(v, dict) for v in data.values()) else {}

    @staticmethod
    def _key(what: tuple) -> str:
        return json.dumps(what)

    def get(self, *what):
        value = self.stored.get(self._key(what))
        self.reused += value is not None
        return value

    def put(self, value, *what) -> None:
        self.stored[self._key(what)] = self.new[self._key(what)] = value

    def save(self) -> None:
        """Add what was measured to the file, beside the other machines' tables and what another
        process stored meanwhile."""
        if not self.new:
            return
        data = self._read()
        data.setdefault(self.machine, {}).update(self.new)
        write_json(self.path, data)
        self.new = {}
