"""Spark's class archive (`mvsink.io.spark_classes`): where a driver's options come from, and
that a JVM given an archive that is not a good one still starts."""

from __future__ import annotations

import subprocess
from pathlib import Path

from mvsink.io import spark_classes


def test_the_options_are_appended_to_the_drivers_own() -> None:
    use = spark_classes.USE.format("/x.jsa")
    assert spark_classes.merged({}, use) == {"spark.driver.extraJavaOptions": use}
    given = {"spark.driver.extraJavaOptions": "-Da=1", "spark.master": "local"}
    assert spark_classes.merged(given, use) == {
        "spark.driver.extraJavaOptions": f"-Da=1 {use}",
        "spark.master": "local",
    }
    assert spark_classes.merged(given, "") == given


def test_no_archive_built_no_options(tmp_path: Path) -> None:
    assert spark_classes.driver_options(tmp_path) == ""
    path = spark_classes.archive_path(tmp_path)
    assert path is not None and path.parent == tmp_path / "spark-classes"
    path.parent.mkdir()
    path.write_bytes(b"")
    assert spark_classes.driver_options(tmp_path) == spark_classes.USE.format(path)


def test_a_jvm_given_a_corrupt_or_foreign_archive_starts_without_it(tmp_path: Path) -> None:
    """The JVM checks the archive against itself and ignores one that does not match: a stale
    archive costs its benefit (no class sharing at all, not even the JDK's own), never a
    start."""
    bad = tmp_path / "bad.jsa"
    bad.write_bytes(bytes(range(256)) * 400)
    done = subprocess.run(
        ["java", *spark_classes.USE.format(bad).split(), "-version"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "(build" in done.stderr and "sharing" not in done.stderr
