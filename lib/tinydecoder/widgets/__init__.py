"""Interactive widgets for the notebooks (ipywidgets 8).

The pattern, for every widget:
1. a pure data function, e.g. `query_attention(angle, length)`, returns numbers (dicts of
   arrays) for given slider values — unit tests call it directly, no browser needed;
2. a draw function turns that data into a matplotlib figure (or a Table / text);
3. a builder, e.g. `query_widget()`, makes the sliders/dropdowns (each with a clear
   `description=`) and hands all three to `panel(...)`, which redraws the Output area on every
   change and returns the widget. The returned box keeps `.controls` (name -> widget),
   `.output` (the Output area), `.data` (the latest data) and `.refresh()`, so a test can set
   `box.controls["angle"].value = 90` and check `box.data`.
"""
from ..core.reference import LAYER_STEPS, layer_input  # noqa: F401 (notebooks use widgets.layer_input)
from ..core.validate import check_token_ids  # noqa: F401 (widgets.check_token_ids)
from .base import *  # noqa: F403
from .base import STYLE, _in_ipython  # noqa: F401
from .model import *  # noqa: F403
from .prefix import prefix_reuse_figure, prefix_reuse_widget  # noqa: F401
from .realmodel import *  # noqa: F403
from .serving import *  # noqa: F403
