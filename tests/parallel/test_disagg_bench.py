"""Notebook 23's measurement: colocated, chunked and disaggregated serving of one workload on real
ranks (a small random model: seconds), the cores each rank is pinned to, and conclusions whose
wording follows the numbers."""
import os

import pytest

import tinydecoder as td
from tinydecoder.parallel.disagg import TimedRequest, kv_bytes
from tinydecoder.parallel.disagg_bench import conclusions, measure, split_cores, summarize
from tinydecoder.parallel.launch import mpi_missing_reason
from tinydecoder.parallel.tp import resolve_model


def test_split_cores():
    assert split_cores(2) == {"colocated": [[0, 1]], "chunked": [[0, 1]], "disaggregated": [[0], [1]]}
    assert split_cores(5)["disaggregated"] == [[0, 1], [2, 3, 4]]
    with pytest.raises(ValueError, match="at least 2 cores"):
        split_cores(1)


def engine_run(gaps, steps):
    return {"tpot": gaps, "steps": steps}


def fake_runs(di_gaps, co_gaps, mixed=True):
    co_steps = [(0.01, 2, 0)] * 5 + ([(0.5, 2, 100)] if mixed else [])
    return {"colocated": engine_run(co_gaps, co_steps),
            "chunked": engine_run(co_gaps, [(0.01, 2, 0)] * 4 + [(0.05, 2, 6)] * 3),
            "disaggregated": {"tpot": di_gaps, "step_seconds": [0.02] * 6, "recv_seconds": {0: 0.001},
                              "prefill": {"bytes_sent": {0: 4096}, "prefill_seconds": {0: 0.4}}}}


FACTS = {"colocated": {"cores": [0, 1]}, "disaggregated": {"cores": [1]}}


def test_summary_and_conclusions_follow_the_numbers():
    s = summarize(fake_runs([0.02] * 99 + [0.03], [0.01] * 95 + [0.5] * 5))
    assert s["colocated"]["mixed_steps"] == 1 and s["colocated"]["max_prefill_rows"] == 100
    assert s["chunked"]["mixed_steps"] == 3 and s["disaggregated"]["kv_bytes"] == 4096
    assert s["colocated"]["decode_only_step"] == pytest.approx(0.01)
    text = conclusions(s, FACTS)
    assert text[0].startswith("Tail: the disaggregated decode rank had the flattest")
    assert "1 of the colocated engine's 6 decoding steps also prefilled (up to 100 prompt rows" in text[1]
    assert "took 2.0x as long as one on the colocated engine's 2 cores" in text[2]
    assert "4,096 bytes" in text[3] and "0.25% of the 400.0 ms" in text[3]
    assert "disaggregation bought the tail at the price of the median" in text[4]

    worse = conclusions(summarize(fake_runs([0.02] * 90 + [0.9] * 10, [0.01] * 99 + [0.02], mixed=False)), FACTS)
    assert worse[0].startswith("Tail: colocated, not the disaggregated decode rank")
    assert "did not test it" in worse[1]
    faster = dict(FACTS, disaggregated={"cores": [1]})
    runs = fake_runs([0.02] * 100, [0.01] * 100)
    runs["disaggregated"]["step_seconds"] = [0.005] * 6
    line = conclusions(summarize(runs), faster, load=99.0)[2]
    assert "was 2.0x faster than one" in line and "more threads did not help" in line and "load average 99.0" in line
    assert "load average" not in conclusions(summarize(runs), faster, load=0.0)[2]
    assert "disaggregation lost the tail" in worse[4]


@pytest.mark.skipif(mpi_missing_reason() is not None or (os.cpu_count() or 1) < 2,
                    reason="needs mpi4py/mpiexec and 2 cores")
def test_three_modes_on_real_ranks_give_the_same_tokens_on_their_cores():
    small = resolve_model("small")
    workload = [TimedRequest(0, (1, 5, 9, 40), 8, 0.0), TimedRequest(1, tuple(range(3, 33)), 3, 0.02)]
    runs = measure("small", workload, chunk_budget=4, timeout=120, cores=split_cores(2))
    for r in workload:
        expected = td.generate(small, list(r.prompt), r.max_new_tokens).new_tokens
        assert runs["colocated"]["tokens"][r.id] == runs["chunked"]["tokens"][r.id] == \
            runs["disaggregated"]["tokens"][r.id] == expected
    assert runs["disaggregated"]["prefill"]["bytes_sent"][1] == kv_bytes(small, 30)
    assert runs["colocated"]["facts"]["cores"] == [0, 1]
    assert [runs["disaggregated"]["prefill"]["facts"]["cores"], runs["disaggregated"]["facts"]["cores"]] == [[0], [1]]
    assert max(n for _, _, n in runs["chunked"]["steps"]) <= 4  # the budget holds every step's rows
    assert max(n for _, _, n in runs["colocated"]["steps"]) >= 30  # the long prompt went in whole
    assert len(runs["colocated"]["tpot"]) == 7 + 2  # every gap after a request's first token
    for facts in (runs["disaggregated"]["facts"], runs["disaggregated"]["prefill"]["facts"]):
        assert facts["numba_threads"] in (None, 1)
