"""The PostgreSQL + pgvector backend: the siblings of db/'s modules for what differs by SQL
dialect (connection, frozen DDL and its migrations, tsvector search, pgvector KNN)."""
