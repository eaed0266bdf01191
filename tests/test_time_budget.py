"""The suite's time budgets (tests/conftest.py) fail a test or fixture that grows past them, loudly."""

from __future__ import annotations

import pytest

from tests.conftest import _budget_scale

pytest_plugins = ["pytester"]

CONFTEST = """
from tests.conftest import pytest_configure, pytest_fixture_setup, pytest_runtest_call  # noqa: F401
import tests.conftest as shared
shared.FIXTURE_BUDGETS_S["slow_fixture"] = 0.2
"""

TESTS = """
import time
import pytest

@pytest.fixture
def slow_fixture():
    time.sleep(0.5)

@pytest.mark.budget(0.2)
def test_over_its_budget():
    time.sleep(0.5)

@pytest.mark.budget(5)
def test_within_its_budget():
    time.sleep(0.3)

def test_its_fixture_is_over(slow_fixture):
    pass
"""


def test_a_test_or_fixture_over_its_budget_fails_with_one_line_naming_it(pytester, monkeypatch):
    monkeypatch.delenv("EAGLE3_TEST_BUDGET_SCALE", raising=False)
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_budgets=TESTS)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1, errors=1)
    result.stdout.fnmatch_lines(["*test_over_its_budget took 0.5 s, over its time budget of 0.2 s*"])
    result.stdout.fnmatch_lines(["*fixture 'slow_fixture' took 0.5 s, over its time budget of 0.2 s*"])


def test_the_scale_stretches_every_budget_and_zero_turns_them_off(pytester, monkeypatch):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_budgets=TESTS)
    for scale in ("4", "0"):  # 0.2 s x 4 covers the 0.5 s sleeps
        monkeypatch.setenv("EAGLE3_TEST_BUDGET_SCALE", scale)
        pytester.runpytest_inprocess("-p", "no:cacheprovider").assert_outcomes(passed=3)
    monkeypatch.setenv("EAGLE3_TEST_BUDGET_SCALE", "two")
    with pytest.raises(pytest.UsageError, match=r"^EAGLE3_TEST_BUDGET_SCALE='two': a number \(1 = as measured"):
        _budget_scale()  # what pytest_configure calls: the run stops before any test
