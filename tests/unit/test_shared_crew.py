"""`SharedCrew`: the residents stay while any driver of the host uses them and go home with the
last one, so that no Spark job (a new sink's warm-up) waits for slots no loop would free."""

from __future__ import annotations

from typing import Any, cast

import pytest

from services.write.resident import Crew, SharedCrew


class Recorded:
    """Stands in for `Crew` (Spark-free): records dismissals."""

    def __init__(self) -> None:
        self.dismissed: list[bool] = []

    def dismiss(self, failed: bool = False) -> None:
        self.dismissed.append(failed)


@pytest.mark.parametrize(
    ("drivers", "leaving", "dismissed"),
    [
        (1, 1, [False]),
        (2, 1, []),
        (2, 2, [False]),
        (3, 2, []),
    ],
)
def test_the_crew_goes_home_with_the_last_driver(
    drivers: int, leaving: int, dismissed: list[bool]
) -> None:
    crew = Recorded()
    shared = SharedCrew(cast(Crew, crew))
    for _ in range(drivers):
        shared.join()
    for _ in range(leaving):
        shared.dismiss()
    assert crew.dismissed == dismissed
    assert shared.drivers == drivers - leaving


def test_a_driver_joining_after_the_last_left_keeps_it_again() -> None:
    crew: Any = Recorded()
    shared = SharedCrew(crew)
    shared.join()
    shared.dismiss(failed=True)
    shared.join()
    shared.join()
    shared.dismiss()
    assert crew.dismissed == [True] and shared.drivers == 1
    shared.close()
    assert crew.dismissed == [True, False]
