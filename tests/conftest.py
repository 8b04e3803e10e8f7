"""Shared test setup: draw figures off-screen and close each test's figures after it."""
import matplotlib

matplotlib.use("Agg")  # tests only (this process); notebooks keep the inline backend

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")
