"""The suite's rule for Ray's memory monitor (tests/conftest.py): an OOM kill is a skip with
its reason, any other failure stays a failure."""

from __future__ import annotations

pytest_plugins = ["pytester"]


def test_ray_oom_failure_becomes_a_skip_and_other_failures_stay(pytester):
    from pathlib import Path

    pytester.makeconftest((Path(__file__).parent / "conftest.py").read_text())
    pytester.makepyfile(
        test_x="""
        def test_oom():
            raise AssertionError("ray.exceptions.OutOfMemoryError: Task was killed due to the "
                                 "node running low on memory.")

        def test_real_failure():
            assert 1 == 2
    """
    )
    result = pytester.runpytest("-rs")
    result.assert_outcomes(failed=1, skipped=1)
    result.stdout.fnmatch_lines(["*memory monitor killed a worker*"])
