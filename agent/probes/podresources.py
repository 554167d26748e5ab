"""Reading the kubelet's PodResources API once per poll: failures logged per state change and counted.

A kubelet socket that is missing, refuses, hangs or answers garbage must
cost the agent nothing but this one reading: the probe catches every failure
of the source, keeps the count by reason for the metrics, and logs one line
when the state changes (working, or failing for a given reason), not one per
poll, so a node without a kubelet socket does not fill the log every ten
seconds.
"""

from __future__ import annotations

from agent.samples import PodResourcesFailure, PodResourcesSample
from agent.sources.base import PodResourcesError, PodResourcesSource
from gpuwarden.logconfig import get_logger

log = get_logger(__name__)


class PodResourcesProbe:
    """Reads ``List`` then ``GetAllocatableResources`` each poll; never raises."""

    def __init__(self, source: PodResourcesSource, path: str = "") -> None:
        self._source = source
        self._path = path
        self._failures: dict[PodResourcesFailure, int] = {}
        # The state last logged: None before the first read, "ok", or a failure reason,
        # and the error it began with.
        self._state: str | None = None
        self._state_error: str | None = None

    def _count(self, failure: PodResourcesFailure) -> None:
        self._failures[failure] = self._failures.get(failure, 0) + 1

    def _transition(self, state: str, error: str | None) -> str | None:
        """Log a change of state; returns the error the current state began with.

        The same message for as long as the state lasts: it is published in
        the GPUNode, which must not be rewritten every poll because a
        timeout's wording varied.
        """
        if state == self._state:
            return self._state_error
        first = self._state is None
        self._state, self._state_error = state, error
        if state == "ok":
            log.info("podresources_read", socket=self._path, state="ok", first=first)
        else:
            log.warning(
                "podresources_unavailable",
                socket=self._path,
                reason=state,
                error=error,
                effect="the GPUs' holders are kept as last read; the rest of the agent goes on",
            )
        return error

    def read(self) -> PodResourcesSample:
        try:
            held = self._source.list()
        except PodResourcesError as exc:
            self._count(exc.failure)
            return PodResourcesSample(
                failure=exc.failure, error=self._transition(exc.failure.value, str(exc)), failures=self.failures
            )
        except Exception as exc:
            # A bug or an odd answer must cost this reading only.
            log.exception("podresources_probe_failed")
            self._count(PodResourcesFailure.ERROR)
            return PodResourcesSample(
                failure=PodResourcesFailure.ERROR,
                error=self._transition(PodResourcesFailure.ERROR.value, repr(exc)),
                failures=self.failures,
            )
        allocatable: frozenset[str] | None = None
        failure: PodResourcesFailure | None = None
        error: str | None = None
        try:
            allocatable = self._source.allocatable()
        except PodResourcesError as exc:
            failure, error = exc.failure, str(exc)
        except Exception as exc:
            log.exception("podresources_probe_failed")
            failure, error = PodResourcesFailure.ERROR, repr(exc)
        if failure is not None:
            self._count(failure)
        error = self._transition("ok" if failure is None else failure.value, error)
        return PodResourcesSample(
            held=held, listed=True, allocatable=allocatable, failure=failure, error=error, failures=self.failures
        )

    @property
    def failures(self) -> tuple[tuple[PodResourcesFailure, int], ...]:
        """Failed calls since start, by reason, in a fixed order."""
        return tuple((f, self._failures[f]) for f in PodResourcesFailure if f in self._failures)
