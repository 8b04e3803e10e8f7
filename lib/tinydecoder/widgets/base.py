"""The widget pattern: `panel` wires controls, a pure data function and a drawing together (see widgets/__init__)."""

from __future__ import annotations

import ipywidgets as W
import matplotlib.pyplot as plt

from ..core.reference import LAYER_STEPS, decoder_block, layer_input  # noqa: F401 (notebooks use widgets.layer_input)

STYLE = {"description_width": "initial"}  # show the whole description, not a clipped one


# ----------------------------------------------------------------------------- the pattern

def _in_ipython():
    from IPython import get_ipython

    return get_ipython() is not None


def show(obj):
    """Display a figure (then close it, so it is not shown twice), a Table/HTML object, or text
    in the current output. Outside IPython (unit tests) figures are just closed."""
    from IPython.display import display

    if not _in_ipython():
        if isinstance(obj, plt.Figure):
            plt.close(obj)
        return
    if obj is None:
        return
    if isinstance(obj, str):
        print(obj)
    else:
        display(obj)
    if isinstance(obj, plt.Figure):
        plt.close(obj)


def panel(controls, compute, draw, *, title=None):
    """Wire widgets to a pure function and a drawing.

    controls: dict name -> widget (a slider, dropdown, ...); compute(**values) -> data;
    draw(data) -> a Figure, a Table/HTML object or a string, shown in an Output area.
    Draws once now, then on every change of any control. Returns a VBox (see module doc)."""
    controls = dict(controls)
    out = W.Output()
    header = [W.HTML(f"<b>{title}</b>")] if title else []
    box = W.VBox(header + [W.HBox(list(controls.values())), out])

    def refresh(_change=None):
        box.data = compute(**{name: w.value for name, w in controls.items()})
        if _in_ipython():
            out.clear_output(wait=True)
        with out:
            show(draw(box.data))

    for w in controls.values():
        w.observe(refresh, names="value")
    box.controls, box.output, box.refresh = controls, out, refresh
    refresh()
    return box
