"""The fast path's tests: `fused_layers_of(module)` wraps a fused module's `run_layers` so that a
test sees which layers ran fused (the rows of each, all of a pass's layers in one call)."""
import pytest


@pytest.fixture
def fused_layers_of(monkeypatch):
    def record(module) -> list:
        calls, real = [], module.run_layers

        def run_layers(model, x, *args):
            ran = real(model, x, *args)
            calls.extend([x.shape[0]] * ran)
            return ran

        monkeypatch.setattr(module, "run_layers", run_layers)
        return calls

    return record
