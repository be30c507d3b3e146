"""Option choices read from the agent registry (adapters/registry.py) each time click asks,
so an agent added to the registry is offered without editing any command."""

from __future__ import annotations

from collections.abc import Callable

import click


class ReadChoice(click.Choice):
    """A click.Choice whose values `read()` gives when click checks or shows them, not when
    the CLI is imported (which loads no agent's module)."""

    def __init__(self, read: Callable[[], tuple[str, ...]]):
        self.read = read
        super().__init__((), case_sensitive=True)

    @property
    def choices(self) -> tuple[str, ...]:
        return tuple(self.read())

    @choices.setter
    def choices(self, _value) -> None:  # click.Choice.__init__ sets it; `read` is the truth
        pass


def _registry():
    from ..adapters import registry

    return registry


def agent_choice() -> ReadChoice:
    """An agent's name."""
    return ReadChoice(lambda: _registry().agent_names())


def adapter_choice() -> ReadChoice:
    """What `--adapter` takes: an agent or none."""
    return ReadChoice(lambda: _registry().adapter_names())


def config_adapter_choice() -> ReadChoice:
    """What session.adapter takes: auto, an agent or none."""
    return ReadChoice(lambda: _registry().config_choices())


def hook_format_choice() -> ReadChoice:
    """What `llmem hook --format` takes: text, json, or an agent's name (its hooks' answer;
    adapters/agent.py `hook_format`). Names only: no agent's module is loaded to check."""
    return ReadChoice(lambda: ("text", "json", *_registry().agent_names()))


def native_choice() -> ReadChoice:
    """The agents whose instruction files `import-native` reads (adapters/native.py)."""

    def read() -> tuple[str, ...]:
        return tuple(agent.name for agent in _registry().all_agents() if agent.keeps_native_files)

    return ReadChoice(read)
