"""Every public entry point refuses bad input with the project's own one-line message:
TypeError for the wrong kind of value, ValueError for a wrong value (issue 20's list)."""
import numpy as np
import pytest

import tinydecoder as td
from tinydecoder.cli import main as cli_main
from tinydecoder.decoding.beam import sequence_logprob
from tinydecoder.serving.scheduler import Request


@pytest.fixture(scope="module")
def toy():
    return td.toy_model()


def test_attention_with_heads_that_do_not_group():
    with pytest.raises(ValueError, match="^6 query heads cannot share 4 KV heads"):
        td.attention(np.zeros((1, 6, 8)), np.zeros((3, 4, 8)), np.zeros((3, 4, 8)))


def test_rope_on_an_odd_head_width():
    with pytest.raises(ValueError, match="head_dim must be an even integer >= 2, got 7"):
        td.apply_rope(np.zeros((2, 1, 7)), [0, 1])


def test_forward_with_positions_of_the_wrong_length(toy):
    with pytest.raises(ValueError, match="positions has 3 entries, but 2 tokens were given"):
        td.forward(toy, [0, 1], positions=[0, 1, 2])
    with pytest.raises(TypeError, match="positions must be a flat sequence of integers"):
        td.forward(toy, [0, 1], positions=[0.5, 1.5])
    limit = toy.config.max_context  # the toy model has a position table of max_context rows
    with pytest.raises(ValueError, match=f"position {limit} is out of range: positions must be in 0..{limit - 1}"):
        td.forward(toy, [0, 1], positions=[0, limit])


def test_sequence_logprob_of_a_negative_token(toy):
    with pytest.raises(ValueError, match="token id -1 at position 0 is out of range"):
        sequence_logprob(toy, [0, 1], [-1])
    assert sequence_logprob(toy, [0, 1], []) == 0.0


def test_cache_append_to_a_layer_that_does_not_exist(toy):
    cache = toy.new_cache()
    k = np.zeros((1, toy.config.n_kv_heads, toy.config.head_dim))
    with pytest.raises(ValueError, match=r"layer -1 is out of range: layers are 0\.\.1"):
        cache.append(-1, k, k)
    assert cache.lengths == [0, 0]  # nothing written


def test_request_with_fractional_token_ids():
    with pytest.raises(TypeError, match="token ids must be integers, got 0.5"):
        Request([0.5, 1.7], 3)
    with pytest.raises(ValueError, match="empty prompt"):
        Request([], 3)
    assert Request(np.array([3, 4]), 2).prompt == (3, 4)


def test_kernels_of_the_wrong_kind_and_shape(toy):
    with pytest.raises(TypeError, match="Kernels.attention must be a function or None"):
        td.Kernels(attention=3)
    with pytest.raises(TypeError, match="kernels must be a tinydecoder Kernels"):
        td.generate(toy, [0, 1], 2, kernels=lambda q, k, v: q)
    wrong_shape = td.Kernels(attention=lambda q, k, v: q[:, :1])
    with pytest.raises(ValueError, match=r"Kernels.attention returned shape \(2, 1, 4\), but the model needs \(2, 2, 4\)"):
        td.forward(toy, [0, 1], kernels=wrong_shape)


@pytest.mark.parametrize("flag", [["--min-p", "0.1"], ["--repetition-penalty", "1.2"], ["--stop", "3"],
                                  ["--beams", "2"]])
def test_cli_speculative_refuses_flags_it_does_not_honour(flag, capsys):
    code = cli_main(["generate", "--model", "toy", "--prompt", "0 1", "--max-new-tokens", "3",
                     "--speculative", "prompt-lookup", *flag])
    assert code == 2
    err = capsys.readouterr().err
    assert f"--speculative does not apply {flag[0]}" in err and err.count("\n") == 1


def test_a_cache_that_is_not_one_is_refused_by_both_paths(toy):
    """check_cache asks for the Cache protocol's three methods itself (what isinstance(x, Cache)
    asks, faster): every cache kind passes, anything missing one is refused with what is needed."""
    from tinydecoder.core.cache import Cache
    from tinydecoder.serving.paged import PagedKVPool

    class NoAppend:
        def __len__(self):
            return 0

        def check(self, config, dtype=None):
            pass

    pool = PagedKVPool.for_model(toy, 4, 4)
    for good in (toy.new_cache(), td.QuantizedKVCache(toy.config, group_size=4, dtype=toy.dtype), pool.new_sequence()):
        assert isinstance(good, Cache)
        td.forward(toy, [1, 2], good)
        td.fast.forward(toy, [3], good)
    for bad in ({}, [], NoAppend(), np.zeros((2, 1, 4))):
        assert not isinstance(bad, Cache)
        for forward in (td.forward, td.fast.forward):
            with pytest.raises(TypeError, match=f"cache must be a KV cache .* with __len__, check and append.* "
                                                f"got {type(bad).__name__}"):
                forward(toy, [1, 2], bad)
