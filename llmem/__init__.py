"""llmem: local-first long-term memory for AI coding agents."""

import os
import sys

__version__ = "0.1.0"

# numpy's OpenBLAS starts a thread per core and keeps them spinning after each product. A
# search scans its vectors on one thread while the FTS query runs on another, and with
# OpenBLAS's own threads beside them the two cores were oversubscribed: at 100k memories the
# in-process hybrid search took 10.7 ms p50 idle, with one BLAS thread 7.5 ms (the dream's
# light phase goes from 1.5 to 2.0 s and uses less CPU). Read when numpy first loads; a value
# the user set is kept.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

# peewee imports every database driver it finds, at its own import: psycopg (PostgreSQL's, in
# the `postgres` extra) costs ~100 ms of CPU, paid by every command and hook on a SQLite store
# (most of a hook's start-up). So peewee is imported with the drivers not yet imported kept
# out, and they are importable again right after it; db/postgres/connection.py imports psycopg
# itself and gives peewee an adapter over it when a store is on PostgreSQL.
_DRIVERS = ("psycopg", "psycopg2", "psycopg2cffi", "pymysql", "MySQLdb")


class _PeeweeWithoutDrivers:
    """A one-shot import hook (sys.meta_path) for `peewee`: its module runs with the drivers out."""

    def find_spec(self, name, path=None, target=None):
        if name != "peewee":
            return None
        sys.meta_path.remove(self)
        from importlib.util import find_spec

        spec = find_spec(name)
        if spec is not None and spec.loader is not None:
            spec.loader = _LoaderWithoutDrivers(spec.loader)
        return spec


class _LoaderWithoutDrivers:
    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        kept_out = [name for name in _DRIVERS if name not in sys.modules]
        for name in kept_out:
            sys.modules[name] = None  # `import name` raises ImportError, as if not installed
        try:
            self.loader.exec_module(module)
        finally:
            for name in kept_out:
                if name in sys.modules and sys.modules[name] is None:
                    del sys.modules[name]

    def __getattr__(self, name):  # get_source, is_package, …: the real loader's
        return getattr(self.loader, name)


if "peewee" not in sys.modules:
    sys.meta_path.insert(0, _PeeweeWithoutDrivers())
