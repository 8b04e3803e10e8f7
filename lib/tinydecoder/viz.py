"""Plots for the notebooks: heatmaps of scores, weights and masks, shape diagrams.

Every function draws with matplotlib and returns the figure (or axes); none calls plt.show().
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
