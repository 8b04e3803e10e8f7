"""Part III's "implement it" exercises (chapters 16, 17, 20): the library's answers pass every
case, and each classic mistake fails the case written to catch it. Also: the library's
references agree with the engine they stand for (PagedKVPool, run_schedule)."""
import io
from contextlib import redirect_stdout

import numpy as np
import pytest

import tinydecoder as td
from tinydecoder.course.implement import ch16, ch17, ch20
from tinydecoder.course.implement.case import Case
from tinydecoder.lessons.memory_replay import allocator_tables, request_workload, workload_memory
from tinydecoder.serving.block_allocator import BlockAllocator, blocks_for
from tinydecoder.serving.blocks import PoolExhaustedError
from tinydecoder.serving.scheduler import ARRIVAL_PATTERNS, demo_requests, run_schedule
from tinydecoder.serving.step_plan import replay, schedule_plans, schedule_step


def failing(module, exercise, fn) -> set:
    """Names of the cases `fn` fails (a raise counts as a fail, as in the checker)."""
    out = set()
    for case in module.EXERCISES[exercise]:
        assert isinstance(case, Case)
        try:
            ok = bool(case.run(fn))
        except Exception:
            ok = False
        if not ok:
            out.add(case.name)
    return out


# ------------------------------------------------------------------ 16: requests_in_budget
def capacity(config, dtype_bytes, context, budget, block_size=None, *, heads="kv", kv_default="q",
             head_dim=True, blocks="ceil", rounding="floor", factor=2):
    """A learner's requests_in_budget, with one mistake switched on by a keyword."""
    n_q = config["num_attention_heads"]
    n_kv = config.get("num_key_value_heads", n_q if kv_default == "q" else 1)
    if heads == "q":
        n_kv = n_q
    d = config["head_dim"] if head_dim and "head_dim" in config else config["hidden_size"] // n_q
    per_token = factor * config["num_hidden_layers"] * n_kv * d * dtype_bytes
    positions = context
    if block_size is not None:
        positions = {"ceil": -(-context // block_size), "floor": context // block_size,
                     "floor+1": context // block_size + 1}[blocks] * block_size
    share = budget / (per_token * positions)
    return int(np.floor(share)) if rounding == "floor" else int(round(share))


def variant(**mistake):
    return lambda *args: capacity(*args, **mistake)


def test_16_library_and_a_correct_answer_pass():
    assert failing(ch16, "requests_in_budget", ch16.library) == set()
    assert failing(ch16, "requests_in_budget", variant()) == set()


@pytest.mark.parametrize("mistake, case", [
    (dict(heads="q"), "grouped-query attention"),
    (dict(kv_default="one"), "config without num_key_value_heads"),
    (dict(head_dim=False), "config with head_dim"),
    (dict(blocks="floor"), "partly filled last block"),
    (dict(blocks="floor+1"), "context a whole number of blocks"),
    (dict(rounding="round"), "round down"),
    (dict(factor=1), "Llama-2-7B in 40 GiB"),
])
def test_16_each_mistake_fails_its_case(mistake, case):
    assert case in failing(ch16, "requests_in_budget", variant(**mistake))


def test_16_a_float_answer_is_refused():
    assert "round down" in failing(ch16, "requests_in_budget", lambda *a: float(ch16.library(*a)))


# ------------------------------------------------------------------ 17: BlockAllocator
class FloorBlocks(BlockAllocator):  # forgets the partly filled last block
    def grow(self, name, n_positions):
        return super().grow(name, (n_positions // self.block_size) * self.block_size)


class FloorPlusOne(BlockAllocator):  # one block too many when the blocks are exactly full
    def grow(self, name, n_positions):
        return super().grow(name, (n_positions // self.block_size + 1) * self.block_size if n_positions else 0)


class FreesShared(BlockAllocator):  # frees every block of the sequence, whatever its count
    def free(self, name):
        table = self.tables.pop(name, [])
        for block in table:
            self.refcount[block] = 0
            if block not in self.free_list:
                self.free_list.append(block)
        return len(table)


class NeverForgets(BlockAllocator):  # decrements but keeps the table: a second free frees again
    def free(self, name):
        freed = 0
        for block in self.tables.get(name, []):
            self.refcount[block] -= 1
            if self.refcount[block] == 0:
                self.free_list.append(block)
                freed += 1
        return freed


class AliasFork(BlockAllocator):  # the child is the parent's list itself, and counts stay at 1
    def fork(self, parent, child):
        self.tables[child] = self.tables[parent]


class AllocatesAgain(BlockAllocator):  # takes ceil(n / B) new blocks on every call
    def grow(self, name, n_positions):
        need = blocks_for(n_positions, self.block_size)
        if need > len(self.free_list):
            raise PoolExhaustedError("full")
        taken, self.free_list = self.free_list[:need], self.free_list[need:]
        for b in taken:
            self.refcount[b] = 1
        self.tables[name] = self.tables.get(name, []) + taken
        return taken


class HalfWrites(BlockAllocator):  # takes blocks one by one and fails half-way on a full pool
    def grow(self, name, n_positions):
        table = self.tables.setdefault(name, [])
        while len(table) < blocks_for(n_positions, self.block_size):
            if not self.free_list:
                raise PoolExhaustedError("full")
            block = self.free_list.pop(0)
            self.refcount[block] = 1
            table.append(block)


class LastFirst(BlockAllocator):  # takes blocks from the back of the free list
    def grow(self, name, n_positions):
        self.free_list.reverse()
        try:
            return super().grow(name, n_positions)
        finally:
            self.free_list.reverse()


def test_17_library_passes():
    assert failing(ch17, "BlockAllocator", BlockAllocator) == set()


@pytest.mark.parametrize("cls, case", [
    (FloorBlocks, "partly filled last block"),
    (FloorPlusOne, "whole number of blocks"),
    (FreesShared, "free a shared block"),
    (NeverForgets, "free twice"),
    (AliasFork, "fork shares"),
    (AllocatesAgain, "growing one position at a time"),
    (HalfWrites, "a full pool"),
    (LastFirst, "two sequences"),
])
def test_17_each_mistake_fails_its_case(cls, case):
    assert case in failing(ch17, "BlockAllocator", cls)


def test_17_allocator_hands_out_the_blocks_paged_kv_pool_does():
    workload = request_workload(20, seed=0, mean_gap=2.0)
    for block_size, n_blocks in ((1, None), (4, None), (4, 40), (16, None)):
        memory = workload_memory(workload, block_size, n_blocks=n_blocks)
        tables = allocator_tables(BlockAllocator(memory.n_blocks, block_size), workload)
        assert len(tables) == len(memory.tables)
        assert all(np.array_equal(a, b) for a, b in zip(tables, memory.tables))


def test_17_allocator_errors():
    alloc = BlockAllocator(2, 4)
    with pytest.raises(PoolExhaustedError, match="needs 3 more block"):
        alloc.grow("a", 9)
    assert alloc.tables == {} and alloc.free_list == [0, 1]
    with pytest.raises(ValueError, match="n_positions"):
        alloc.grow("a", -1)
    with pytest.raises(KeyError):
        alloc.fork("nobody", "b")
    alloc.grow("a", 1)
    with pytest.raises(ValueError, match="exists already"):
        alloc.fork("a", "a")
    assert alloc.free("nobody") == 0


# ------------------------------------------------------------------ 19: schedule_step
def plan_with(running, waiting, budget, max_running, *, order="decode_first", admit_while=lambda left: left > 0,
              cap=True, chunk="fit", continue_first=True):
    """A learner's schedule_step, with one mistake switched on by a keyword."""
    left, plan = budget, []

    def decodes():
        nonlocal left
        for name, p in running:
            if p == 0 and (left > 0 or order == "no_budget_check"):
                plan.append((name, "decode", 1))
                left -= 1

    def chunks():
        nonlocal left
        for name, p in running:
            if p > 0 and left > 0:
                n = min(p, left) if chunk == "fit" else p
                plan.append((name, "prefill", n))
                left -= n

    def admissions():
        nonlocal left
        n_running = len(running)
        for name, p in waiting:
            if not admit_while(left) or (cap and n_running >= max_running):
                break
            n = min(p, left) if chunk == "fit" else p
            plan.append((name, "prefill", n))
            left -= n
            n_running += 1

    if order in ("decode_first", "no_budget_check"):
        decodes()
    if continue_first:
        chunks()
        admissions()
    else:
        admissions()
        chunks()
    if order == "prefill_first":
        decodes()
    return plan


def step_variant(**mistake):
    return lambda r, w, b, m: plan_with(r, w, b, m, **mistake)


def test_19_library_and_a_correct_answer_pass():
    assert failing(ch20, "schedule_step", schedule_step) == set()
    assert failing(ch20, "schedule_step", step_variant()) == set()


@pytest.mark.parametrize("mistake, case", [
    (dict(order="prefill_first"), "decodes go first"),
    (dict(chunk="whole"), "a chunk fits the budget"),
    (dict(admit_while=lambda left: left >= 0), "budget spent"),
    (dict(cap=False), "max_running"),
    (dict(continue_first=False), "running prefills before admissions"),
])
def test_19_each_mistake_fails_its_case(mistake, case):
    assert case in failing(ch20, "schedule_step", step_variant(**mistake))


def test_19_reversed_arrival_order_fails():
    lifo = lambda r, w, b, m: schedule_step(r, list(reversed(w)), b, m)
    assert "arrival order" in failing(ch20, "schedule_step", lifo)


def test_19_replay_with_schedule_step_is_run_schedule():
    model = td.toy_model()
    for pattern in ARRIVAL_PATTERNS:
        for budget in (1, 2, 3, 5, 8, 16, 32):
            for max_running in (None, 1, 2, 4):
                if max_running and max_running > budget:
                    continue
                requests = demo_requests(pattern)
                sched = run_schedule(model, requests, token_budget=budget, max_running=max_running)
                assert replay(schedule_step, requests, budget, max_running) == schedule_plans(sched)


def test_19_replay_refuses_a_plan_that_cannot_run():
    requests = demo_requests()
    with pytest.raises(ValueError, match="prefills 99 tokens"):
        replay(lambda r, w, b, m: [(w[0][0], "prefill", 99)] if w else [], requests, 8)
    with pytest.raises(ValueError, match="not waiting or running"):
        replay(lambda r, w, b, m: [("C", "prefill", 1)], requests, 8)
    with pytest.raises(RuntimeError, match="max_steps"):
        replay(lambda r, w, b, m: [], requests, 8, max_steps=50)


def test_checker_output_never_shows_the_expected_plan():
    from tinydecoder.course.exercises import check_implementation

    buf = io.StringIO()
    with redirect_stdout(buf):
        report = check_implementation("schedule_step", step_variant(order="prefill_first"))
    assert not report.passed and "decodes go first" in report.failed
    assert "('A', 'decode', 1)" not in buf.getvalue()
