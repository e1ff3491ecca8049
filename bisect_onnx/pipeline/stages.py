"""A sample's comparison as one list of stages over one typed state.

Both forms (PyTorch against ONNX, ONNX against ONNX) run each sample as a list of
:class:`Stage`: each says when it applies and returns the state with what it found
(a frozen dataclass, updated with :func:`dataclasses.replace`), so the order of the
work is the list, read top to bottom, and a new stage is one more entry. The
findings a stage adds are the sample's :class:`~bisect_onnx.judge.findings.Findings`;
the report is assembled from them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["Stage", "run_stages", "always"]

logger = logging.getLogger(__name__)

State = TypeVar("State")


def always(state: object) -> bool:
    """A stage every sample goes through."""
    return True


@dataclass(frozen=True)
class Stage(Generic[State]):
    """One step of a sample's comparison."""

    name: str
    """What it does, for the log."""
    run: Callable[[State], State]
    """The state with what the stage found."""
    applies: Callable[[State], bool] = always
    """Whether the stage has anything to do for this state."""


def run_stages(stages: Sequence[Stage[State]], state: State) -> State:
    """Each stage that applies, in order, on the state the one before it returned."""
    for stage in stages:
        if stage.applies(state):
            logger.debug("stage: %s", stage.name)
            state = stage.run(state)
        else:
            logger.debug("stage skipped: %s", stage.name)
    return state
