"""The reader: every process's files parsed, checked and merged into metric families at scrape, never raising.

A corrupt or truncated file is skipped and renamed aside (``*.db.corrupt-<unix ms>``), counted
and listed, and never stops a scrape. Files of dead processes are merged into
``*_routescope-archive.db`` by ``compact``; archives are read last.
"""

from __future__ import annotations

import os

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector

from . import mpfile
from .directory import our_files, quarantine
from .health import Problems, os_problem


class RoutescopeMultiProcessCollector(MultiProcessCollector):
    """Reads only routescope's files (not vLLM's, which may share the directory); never raises.

    No lock: archives are read last, and a file an archive lists as merged is dropped, so a
    compaction running meanwhile neither hides nor doubles a dead process's values."""

    def __init__(self, registry: CollectorRegistry | None, path: str, problems: Problems | None = None,
                 key_cache: dict[str, list] | None = None) -> None:
        self._path = path
        self._problems = problems if problems is not None else Problems(lambda stage: None)
        self._cache = key_cache if key_cache is not None else {}
        if registry:
            registry.register(self)

    def read(self) -> dict[str, list]:
        """File name -> entries of every readable file not yet merged into an archive.

        A file's ``read`` condition (an I/O error) lasts until it reads again, or is gone."""
        try:
            names = our_files(self._path)
        except OSError as exc:
            self._problems.report("read", self._path, os_problem(exc), f"cannot list {self._path}: {exc}",
                                  blocking=True)
            return {}
        self._problems.clear("read", self._path)
        self._problems.clear_missing("read", self._path, {os.path.join(self._path, n) for n in names})
        parsed: dict[str, list] = {}
        merged: set[str] = set()
        for name in names:
            full = os.path.join(self._path, name)
            try:
                entries, manifest = mpfile.read(full, self._cache)
            except FileNotFoundError:
                self._problems.clear("read", full)
                continue  # compacted meanwhile: its values are in the archive read after it
            except mpfile.CorruptFile as exc:
                self._problems.clear("read", full)  # it reads, if wrongly: no I/O error any more
                quarantine(full, exc.reason, self._problems, "read")
                continue
            except OSError as exc:
                self._problems.report("read", full, os_problem(exc), str(exc))
                continue
            self._problems.clear("read", full)
            parsed[name] = entries
            merged.update(manifest or ())
        return {n: e for n, e in parsed.items() if n not in merged}

    def collect(self):  # type: ignore[override]
        """As prometheus_client's ``_read_metrics`` builds families, from entries already parsed and checked."""
        metrics: dict[str, Metric] = {}
        for name, entries in self.read().items():
            parts = name.split("_")
            typ = parts[0]
            for _key, (metric_name, sample, labels, help_text), value, ts, _off in entries:
                metric = metrics.get(metric_name)
                if metric is None:
                    metric = metrics[metric_name] = Metric(metric_name, help_text, typ)
                labels_key = tuple(sorted(labels.items()))
                if typ == "gauge":
                    metric._multiprocess_mode = parts[1]  # type: ignore[attr-defined]
                    metric.add_sample(sample, labels_key + (("pid", parts[2][:-3]),), value, ts)  # type: ignore[arg-type]
                else:
                    metric.add_sample(sample, labels_key, value)  # type: ignore[arg-type]
        try:
            return list(MultiProcessCollector._accumulate_metrics(metrics, True))
        except Exception as exc:  # noqa: BLE001 - a scrape answers; the files passed every check parse() makes
            self._problems.report("read", self._path, exc.__class__.__name__, f"merging the files failed: {exc}")
            return []


def multiprocess_registry(path: str, problems: Problems | None = None,
                          key_cache: dict[str, list] | None = None) -> CollectorRegistry:
    """A fresh registry that merges every process's files at each scrape."""
    reg = CollectorRegistry()
    RoutescopeMultiProcessCollector(reg, path=path, problems=problems, key_cache=key_cache)
    return reg
