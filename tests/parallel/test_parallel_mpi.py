"""Real ranks under mpiexec: tensor parallelism and disaggregated serving on a small random model
(seconds), the launcher's bounded failures, and the CLI. Skipped when mpi4py/mpiexec is missing."""
import time
from pathlib import Path

import numpy as np
import pytest

import tinydecoder as td
from tinydecoder.course.exercises import within_rounding
from tinydecoder.parallel.launch import RankError, RankTimeout, mpi_missing_reason, run_ranks
from tinydecoder.parallel.tp import expected_traffic, resolve_model

pytestmark = pytest.mark.skipif(mpi_missing_reason() is not None, reason=str(mpi_missing_reason()))
PROMPT = [1, 5, 9, 40, 3, 17, 22]


@pytest.fixture(scope="module")
def small():
    return resolve_model("small")


@pytest.fixture(scope="module")
def tp3():
    return run_ranks(3, "tinydecoder.parallel.tp:generate_rank",
                     dict(model="small", prompt=PROMPT, max_new_tokens=6, keep_logits=True), timeout=120)


def test_tp3_logits_and_tokens_equal_one_process(small, tp3):
    ref = td.generate(small, PROMPT, 6)
    assert tp3[0]["tokens"] == ref.new_tokens
    assert within_rounding(tp3[0]["logits"][0], td.forward(small, PROMPT)) == "< 1e-05 (float32)"
    for got, event in zip(tp3[0]["logits"][1:], ref.events[1:]):
        assert within_rounding(got[-1], event.logits) == "< 1e-05 (float32)"
    assert all(r["tokens"] is None and r["logits"] is None for r in tp3[1:])  # only rank 0 has the logits


def test_traced_collectives_equal_the_computed_counts(small, tp3):
    for r in tp3:
        prefill, decode = r["steps"][0], r["steps"][1]
        want = expected_traffic(small.config, 3, rows=len(PROMPT), logits_rows=len(PROMPT))
        assert {k: prefill[k] for k in ("allreduce", "allreduce_bytes", "gather", "gather_bytes", "bcast")} == \
            {k: want[k] for k in ("allreduce", "allreduce_bytes", "gather", "gather_bytes", "bcast")}
        want = expected_traffic(small.config, 3)
        assert (decode["allreduce"], decode["allreduce_bytes"]) == (want["allreduce"], want["allreduce_bytes"])


def test_each_rank_holds_a_third_of_the_cache(small, tp3):
    whole = td.generate(small, PROMPT, 6).cache.nbytes
    assert [r["cache_bytes"] * 3 for r in tp3] == [whole] * 3


def test_a_degree_that_does_not_divide_fails_on_every_rank():
    with pytest.raises(RankError, match=r"ValueError: tensor-parallel degree 2 does not divide.*Allowed degrees: \[1, 3\]"):
        run_ranks(2, "tinydecoder.parallel.tp:generate_rank", dict(model="small", prompt=[1, 2]), timeout=60)


def test_launcher_reports_a_dead_rank_and_kills_a_hung_job(tmp_path):
    assert [r["rank"] for r in run_ranks(2, "tinydecoder.parallel.launch:hello", timeout=60)] == [0, 1]
    with pytest.raises(RankError, match="rank 1 of 2 died \\(exit code 3\\)"):
        run_ranks(2, "tinydecoder.parallel.launch:crash", dict(rank=1, code=3), timeout=60)
    pid_file = tmp_path / "stalled.pid"
    with pytest.raises(RankTimeout, match="ran past its timeout of 2 s"):
        run_ranks(2, "tinydecoder.parallel.launch:stall", dict(seconds=600, pid_file=str(pid_file)), timeout=2)
    stalled = int(pid_file.read_text())  # the sleeping rank: killed too, not left for 600 s
    for _ in range(50):
        if not running(stalled):
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the stalled rank (pid {stalled}) is still running after the timeout")


def test_a_failed_start_is_tried_once_more_and_reported_with_mpiexecs_words(monkeypatch):
    """mpiexec that starts no rank (here: a flag it does not know) is run twice, then reported with
    its own stderr; a rank that starts and dies is never run again (alone, it leaves mpiexec silent
    and its exit status is the rank's)."""
    from tinydecoder.parallel import launch

    commands, real = [], launch.mpiexec_command
    monkeypatch.setattr(launch, "mpiexec_command",
                        lambda n: commands.append(n) or real(n) + ["--no-such-mpiexec-flag"])
    with pytest.raises(RankError, match=r"mpiexec \(exit status [1-9]\d*\) started none of the 1 rank\(s\), in 2 tries; "
                                        r"mpiexec's stderr ended: .*no-such-mpiexec-flag"):
        run_ranks(1, "tinydecoder.parallel.launch:hello", timeout=60)
    assert commands == [1, 1]
    monkeypatch.setattr(launch, "mpiexec_command", lambda n: commands.append(n) or real(n))
    alone = r"rank\(s\) \[0\] of 1 exited without a result \(mpiexec exit status 5\); mpiexec printed nothing"
    with pytest.raises(RankError, match=alone):
        run_ranks(1, "tinydecoder.parallel.launch:crash", dict(rank=0, code=5), timeout=60)
    assert commands == [1, 1, 1]


def running(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie (Linux /proc)."""
    try:
        return "(zombie)" not in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    with pytest.raises(ValueError, match="module:function"):
        run_ranks(2, "no_colon")


def test_disaggregated_tokens_equal_colocated_and_bytes_are_the_kv_cache(small):
    from tinydecoder.parallel.disagg import TimedRequest, kv_bytes, serve

    workload = [TimedRequest(0, tuple(PROMPT), 8, 0.0), TimedRequest(1, tuple(range(30)), 4, 0.01),
                TimedRequest(2, (3, 4), 5, 0.02)]
    colocated = run_ranks(1, "tinydecoder.parallel.disagg:colocated_rank", dict(model="small", workload=workload),
                          timeout=60)[0]
    served = serve("small", workload, fail_after=1, timeout=60)  # the first attempt's decode rank dies
    assert served["attempts"][0].startswith("rank 1 of 2 died") and served["attempts"][-1] == "ok"
    for r in workload:
        expected = td.generate(small, list(r.prompt), r.max_new_tokens).new_tokens
        assert colocated["tokens"][r.id] == served["decode"]["tokens"][r.id] == expected
        assert served["prefill"]["bytes_sent"][r.id] == served["decode"]["bytes_received"][r.id] == \
            kv_bytes(small, len(r.prompt))
    with pytest.raises(RuntimeError, match=r"failed on all 1 attempt\(s\); requests \[0, 1, 2\] were not served"):
        serve("small", workload, fail_after=1, retries=0, timeout=60)


def test_cli_tensor_parallel_prints_what_one_process_prints(capsys):
    from tinydecoder.cli import main

    args = ["generate", "--model", "toy", "--prompt", "0 1 2 3", "--max-new-tokens", "4"]
    assert main(args) == 0
    plain = capsys.readouterr().out
    assert main(args + ["--tensor-parallel", "1"]) == 0
    assert capsys.readouterr().out == plain == " 3 2 0 4\n"
    assert main(args + ["--tensor-parallel", "2"]) == 2
    assert "degree 2 does not divide 1 KV heads of seed-000-toy" in capsys.readouterr().err
    import json

    assert main(["bench", "--tensor-parallel", "1", "--repeat", "1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["allreduces_per_token"] == report["expected"]["allreduce"] == 2 * 2 + 1
    assert 0 <= report["communication_share"] <= 1 and report["decode_step_seconds"] > 0


@pytest.mark.smollm2
def test_smollm2_tp3_equals_one_process_and_the_cli_text_too(capsys):
    from tinydecoder.cli import main

    model, tok = td.load_smollm2(), td.smollm2_tokenizer()
    prompt = tok.encode("The capital of France is")
    got = run_ranks(3, "tinydecoder.parallel.tp:generate_rank",
                    dict(model="smollm2", prompt=prompt, max_new_tokens=17, keep_logits=True), timeout=600)[0]
    ref = td.generate(model, prompt, 17)
    assert got["tokens"] == ref.new_tokens
    full = td.forward(model, prompt)
    scale = np.abs(full).max()  # logits of size ~27: float32 rounding is relative to that
    assert within_rounding(got["logits"][0] / scale, full / scale) == "< 1e-05 (float32)"
    for lg, event in zip(got["logits"][1:], ref.events[1:]):
        assert within_rounding(lg[-1] / scale, event.logits / scale) == "< 1e-05 (float32)"
    args = ["generate", "--model", "smollm2", "--prompt", "The capital of France is", "--max-new-tokens", "6"]
    assert main(args + ["--tensor-parallel", "3"]) == 0
    assert capsys.readouterr().out == tok.decode(ref.new_tokens[:6]) + "\n"
