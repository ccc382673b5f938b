"""The correlated 3-D Gaussian that the options matrix and the model-feature tests sample: exact moments."""

from __future__ import annotations

import numpy as np

MEAN = np.array([1.0, -2.0, 0.5])
SD = np.array([1.0, 2.0, 0.5])
CORR = np.array([[1.0, 0.8, -0.5],
                 [0.8, 1.0, -0.3],
                 [-0.5, -0.3, 1.0]])
COV = CORR * np.outer(SD, SD)
PRECISION = np.linalg.inv(COV)
