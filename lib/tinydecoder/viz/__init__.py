"""Plots for the notebooks: heatmaps of scores, weights and masks, shape tables and diagrams.

Conventions (so that every notebook's figures look alike):
- a drawing function takes an `ax` (or makes its own figure) and returns what it drew
  (the image, or the figure); none calls plt.show() — the notebook cell does;
- masks are boolean arrays, True = the cell is hidden (a future key), drawn grey and hatched;
  `mask="causal"` builds the causal mask of an [S, T] matrix (queries = the last S of T);
- matrices are [rows, cols] = [queries / positions, keys / dimensions].
"""
from .common import *  # noqa: F403
from .common import MASK_COLOR, MASK_HATCH, MATMUL_OPS, MAX_TICKS  # noqa: F401
from .model import *  # noqa: F403
from .model import LOG_FLOOR  # noqa: F401
from .serving import *  # noqa: F403
from .serving import MEMORY_COLORS, MEMORY_STATES  # noqa: F401
from .trace import *  # noqa: F403
