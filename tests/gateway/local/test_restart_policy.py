"""The restart back-off of `pagedkube up` (gateway/local/restart.py), without processes."""
from __future__ import annotations

import pytest

from pagedkube.gateway.local.restart import Backoff, RestartPolicy


def test_backoff_doubles_from_one_second_to_thirty() -> None:
    backoff = Backoff(RestartPolicy())
    assert [backoff.delay(None) for _ in range(8)] == [1, 2, 4, 8, 16, 30, 30, 30]


def test_a_long_ready_run_resets_the_backoff_a_short_one_does_not() -> None:
    backoff = Backoff(RestartPolicy())
    assert [backoff.delay(None), backoff.delay(5.0), backoff.delay(59.9)] == [1, 2, 4]
    assert backoff.delay(60.0) == 1          # ready for reset_after_s: no crash loop
    assert backoff.delay(0.5) == 2


def test_policy_numbers_are_checked() -> None:
    RestartPolicy(initial_backoff_s=0.5, max_backoff_s=0.5, health_failures=1)
    for bad in ({"initial_backoff_s": 0}, {"initial_backoff_s": 40}, {"health_failures": 0},
                {"health_period_s": 0}, {"reset_after_s": -1}, {"give_up_after": 0}):
        with pytest.raises(ValueError):
            RestartPolicy(**bad)
