"""Option choices read from the agent registry (adapters/registry.py) each time click asks,
so an agent added to the registry is offered without editing any command."""

from __future__ import annotations

import click


class AgentChoice(click.Choice):
    """The registered agents' names, with `first` before them and `last` after them
    (`auto`, `none`). Read when click checks or shows the value, not when the CLI is imported."""

    def __init__(self, first: tuple[str, ...] = (), last: tuple[str, ...] = ()):
        self.first, self.last = first, last
        super().__init__((), case_sensitive=True)

    @property
    def choices(self) -> tuple[str, ...]:
        from ..adapters.registry import agent_names

        return (*self.first, *agent_names(), *self.last)

    @choices.setter
    def choices(self, _value) -> None:  # click.Choice.__init__ sets it; the registry is the truth
        pass


def agent_choice() -> AgentChoice:
    """An agent's name."""
    return AgentChoice()


def adapter_choice() -> AgentChoice:
    """What `--adapter` takes: an agent or none."""
    from ..adapters.registry import NONE

    return AgentChoice(last=(NONE,))


def config_adapter_choice() -> AgentChoice:
    """What session.adapter takes: auto, an agent or none."""
    from ..adapters.registry import AUTO, NONE

    return AgentChoice(first=(AUTO,), last=(NONE,))
