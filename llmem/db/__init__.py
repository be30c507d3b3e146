"""The SQLite store: driver selection, peewee models, FTS5 and sqlite-vec indexes, migrations."""
