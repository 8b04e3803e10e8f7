"""perf.machine: the opt-in allocator setting (the fast path itself never changes the process's malloc)."""
import pytest


def test_only_bench_and_generate_on_smollm2_change_the_allocator(monkeypatch):
    from tinydecoder import cli
    from tinydecoder.perf import machine

    calls = []
    monkeypatch.setattr(machine, "keep_freed_memory", lambda: calls.append(1) or True)
    assert not cli.keep_freed_memory_for(cli.build_parser().parse_args(["generate", "--model", "toy", "--prompt", "0"]))
    assert not cli.keep_freed_memory_for(cli.build_parser().parse_args(["seed"]))
    assert calls == []
    assert cli.keep_freed_memory_for(cli.build_parser().parse_args(["bench", "--model", "smollm2"]))
    assert calls == [1]


@pytest.mark.smollm2
def test_kept_memory_serves_a_repeated_prefill_without_page_faults(smollm2):
    """With the opt-in, a repeated prefill allocates its ~100 MB of temporaries from memory already
    mapped (without it: tens of thousands of page faults here)."""
    resource = pytest.importorskip("resource")
    from tinydecoder import fast
    from tinydecoder.perf.machine import keep_freed_memory

    if not keep_freed_memory():
        pytest.skip("not glibc: malloc settings not available")
    ids = list(range(1000, 1200))
    fast.forward(smollm2, ids, last_only=True)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    fast.forward(smollm2, ids, last_only=True)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before < 2_000
