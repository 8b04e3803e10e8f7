"""viz.radix.radix_icicle: one bar per node, as many lanes tall as the cached sequences below it."""
import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle

from tinydecoder.serving.radix import RadixCache
from tinydecoder.viz.radix import radix_icicle


def test_icicle_layout_by_hand():
    tree = RadixCache()
    for seq in ([1, 2, 3, 4], [1, 2, 5], [7, 7]):
        tree.insert(seq)
    fig, ax = plt.subplots()
    rows = radix_icicle(ax, tree, block_size=2, lane_names=["a", "b", "c"])
    drawn = sorted((tuple(n.key), start, lo, hi) for n, start, lo, hi in rows)
    # lanes in token order: [1,2,3,4] -> 0, [1,2,5] -> 1, [7,7] -> 2; the shared [1,2] spans lanes 0..1
    assert drawn == [((1, 2), 0, 0, 2), ((3, 4), 2, 0, 1), ((5,), 2, 1, 2), ((7, 7), 0, 2, 3)]
    assert tree.sequences() == [[1, 2, 3, 4], [1, 2, 5], [7, 7]]  # the lane order lane_names follow
    assert sum(isinstance(p, Rectangle) for p in ax.patches) == 4
    assert [t.get_text() for t in ax.get_yticklabels()] == ["a", "b", "c"]
    plt.close(fig)


def test_empty_tree_draws_nothing():
    fig, ax = plt.subplots()
    assert radix_icicle(ax, RadixCache(), title="nothing") == [] and not ax.patches
    plt.close(fig)
