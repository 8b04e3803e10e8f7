"""Interactive widgets for the notebooks (ipywidgets).

Each widget's data logic is a pure function (tested without a browser); the widget builder
only wires sliders/dropdowns to that function and draws the result in an Output area.
"""
from __future__ import annotations

import ipywidgets as W
import matplotlib.pyplot as plt
import numpy as np
