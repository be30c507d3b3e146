"""The environment variables that place llmem's own folders and the agents', and that point
llmem at its store, handed on where a launcher does not pass its environment through: Codex
starts an MCP server with a short allow-list of its variables plus the entry's `env` table,
Copilot's docs promise only PATH, and a systemd user unit sees the user manager's environment,
not the shell's. Without them `llmem mcp` or the watcher opens an empty store under $HOME (or
the local SQLite file instead of the team's PostgreSQL one), or watches the wrong agent folder.
"""

from __future__ import annotations

import os
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ..adapters.registry import all_agents

# llmem's own places (paths.py, config.py), then each agent's (its unit's folder_variables).
FOLDER_VARIABLES = ("LLMEM_HOME", "LLMEM_CONFIG", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME",
                    *sorted({name for agent in all_agents() for name in agent.folder_variables}))

# What selects the store: LLMEM_STORE_URL (config.STORE_URL_ENV, which wins over store.url), and
# the libpq variables that say where its password file and TLS files are and how TLS is used.
# Never PGPASSWORD: it would be written into the agent's own config file, which is not private.
STORE_URL_VARIABLE = "LLMEM_STORE_URL"
STORE_PATH_VARIABLES = ("PGPASSFILE", "PGSSLCERT", "PGSSLKEY", "PGSSLROOTCERT")
STORE_VARIABLES = (STORE_URL_VARIABLE, *STORE_PATH_VARIABLES, "PGSSLMODE")


def _absolute(value: str) -> str:
    return os.path.abspath(os.path.expanduser(value))


def folder_environment() -> dict[str, str]:
    """The folder variables set here, each as an absolute path: the server or unit starts in
    another folder than the install did, where a relative path would point elsewhere."""
    return {name: _absolute(os.environ[name]) for name in FOLDER_VARIABLES if os.environ.get(name)}


def without_password(url: str) -> str:
    """`url` with no password in its user part nor in a `password=` query parameter."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return url
    query = parse_qsl(parts.query, keep_blank_values=True)
    kept = [(key, value) for key, value in query if key.lower() != "password"]
    if password is None and len(kept) == len(query):
        return url  # as it is: urlunsplit would write sqlite:////x as sqlite://x
    user, _, host = parts.netloc.rpartition("@")
    netloc = f"{user.partition(':')[0]}@{host}" if password is not None else parts.netloc
    return urlunsplit(parts._replace(netloc=netloc, query=urlencode(kept)))


def _url_in_config_file() -> str | None:
    """store.url as the config file says it (not LLMEM_STORE_URL), None without one."""
    from ..config import load_config
    from ..errors import LlmemError

    try:
        return load_config().written["store"]["url"]
    except (LlmemError, KeyError, TypeError, OSError):
        return None


def store_environment(*, private_file: bool = False) -> tuple[dict[str, str], str | None]:
    """The store variables set here, as the file they go into may hold them, and a note when
    the password llmem uses here cannot be handed on that way (None: nothing to say).

    Into an agent's config file LLMEM_STORE_URL goes without its password: that file keeps the
    mode it has (often 0644), so the server the agent starts reads the password from ~/.pgpass
    or PGPASSFILE, as libpq does. A `private_file` (a systemd unit, 0600) takes it as it is.
    A URL the config file names already (the server reads that private file itself) is not
    repeated: its password-free copy would win over the file's URL with one."""
    env = {name: _absolute(os.environ[name]) for name in STORE_PATH_VARIABLES if os.environ.get(name)}
    if os.environ.get("PGSSLMODE"):
        env["PGSSLMODE"] = os.environ["PGSSLMODE"]
    url = os.environ.get(STORE_URL_VARIABLE, "").strip()
    passed_on = bool(url) and not (
        (in_file := _url_in_config_file()) and without_password(in_file) == without_password(url))
    if passed_on:
        env[STORE_URL_VARIABLE] = url if private_file else without_password(url)
        # libpq finds ~/.pgpass through HOME, which Copilot does not pass on: name the file
        # (a missing one is no error to libpq, so the user may write it after the install).
        if url.startswith("postgres"):
            env.setdefault("PGPASSFILE", os.path.expanduser("~/.pgpass"))
    url_stripped = passed_on and env[STORE_URL_VARIABLE] != url
    password_file = env.get("PGPASSFILE") or os.path.expanduser("~/.pgpass")
    if not (url_stripped or os.environ.get("PGPASSWORD")) or os.path.isfile(password_file):
        return env, None
    what = f"the password in {STORE_URL_VARIABLE}" if url_stripped else "PGPASSWORD"
    return env, (f"{what} is not written into the agent's config file (it is not private), and "
                 f"{password_file} does not exist: put the password there as HOST:PORT:DATABASE:USER:PASSWORD "
                 f"(chmod 600 {password_file}) so the MCP server the agent starts can log in")


def launch_environment(*, private_file: bool = False) -> dict[str, str]:
    """What a launcher that filters the environment must be handed: the folder variables and
    the store variables (a password only into a `private_file`)."""
    return {**folder_environment(), **store_environment(private_file=private_file)[0]}
