"""lessons.gather_cost: the bytes a paged sequence's gather copies, counted, equal the formula."""
import numpy as np

import tinydecoder as td
from tinydecoder.lessons.gather_cost import GatherCount, gather_bytes
from tinydecoder.serving.paged import PagedKVPool


def test_counts_every_gathered_position_of_every_layer():
    model = td.toy_model()
    pool = PagedKVPool.for_model(model, n_blocks=8, block_size=4)
    seq = GatherCount(pool.new_sequence())
    per_token = model.config.kv_bytes_per_token(model.dtype.itemsize)
    ref = model.new_cache()
    out = td.forward(model, [0, 1, 2, 3, 4], seq)
    assert np.array_equal(out, td.forward(model, [0, 1, 2, 3, 4], ref))
    assert seq.copied == gather_bytes(per_token, [5]) and seq.written == 5 * per_token
    td.forward(model, [5], seq)
    assert seq.copied == gather_bytes(per_token, [5, 6]) and seq.calls == 2 * model.config.n_layers
    assert len(seq) == 6 and seq.block_table == seq.seq.block_table  # the sequence shows through
    assert seq.release() == 2 and pool.blocks_free == 8


def test_batch_of_wrapped_sequences():
    model = td.toy_model()
    pool = PagedKVPool.for_model(model, n_blocks=8, block_size=4)
    a, b = GatherCount(pool.new_sequence()), GatherCount(pool.new_sequence())
    td.forward_batch(model, [[0, 1, 2], [3, 4]], [a, b], last_only=True)
    per_token = model.config.kv_bytes_per_token(model.dtype.itemsize)
    assert (a.copied, b.copied) == (3 * per_token, 2 * per_token)
