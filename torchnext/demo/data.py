"""The demo's dataset: scikit-learn's bundled handwritten digits, or a generated stand-in.

The digits (1,797 images of 8x8 pixels, 10 classes) ship inside the scikit-learn
wheel, so nothing is downloaded; ``make demo`` installs the ``[demo]`` extra that
brings scikit-learn. We read the bundled ``digits.csv.gz`` directly rather than call
``sklearn.datasets.load_digits`` because importing scikit-learn (and SciPy) would add
seconds to the start of every worker. Without scikit-learn the demo uses a
deterministic generated dataset of the same shape (ten Gaussian clusters in 64
dimensions) and says so in its summary.

Every worker loads the full dataset (it is 460 KB); the elastic sampler decides who
reads which rows.
"""

from __future__ import annotations

import gzip
import importlib.util
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

__all__ = ["Dataset", "load_dataset"]


@dataclass(frozen=True, kw_only=True)
class Dataset:
    """Features ``x_ND`` (float32, scaled to [0, 1]) and labels ``y_N`` (int64)."""

    x_ND: torch.Tensor
    y_N: torch.Tensor
    name: str
    """Where the data came from, for the summary."""

    @property
    def num_classes(self) -> int:
        return int(self.y_N.max()) + 1


def _digits_path() -> Path | None:
    spec = importlib.util.find_spec("sklearn")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz"
    return path if path.exists() else None


def _generated(seed: int) -> Dataset:
    gen = np.random.default_rng(seed)
    centers_KD = gen.uniform(0.0, 1.0, size=(10, 64))
    y_N = np.repeat(np.arange(10), 180)
    x_ND = centers_KD[y_N] + gen.normal(0.0, 0.35, size=(y_N.size, 64))
    order = gen.permutation(y_N.size)
    return Dataset(
        x_ND=torch.from_numpy(np.clip(x_ND[order], 0.0, 1.0).astype(np.float32)),
        y_N=torch.from_numpy(y_N[order].astype(np.int64)),
        name="generated: 10 Gaussian clusters, 1800 x 64 (scikit-learn not installed)",
    )


def load_dataset(*, prefer_real: bool = True, seed: int = 0) -> Dataset:
    """The digits if scikit-learn is installed (and ``prefer_real``), else the generated set."""
    path = _digits_path() if prefer_real else None
    if path is None:
        return _generated(seed)
    with gzip.open(path, "rt") as fh:
        table = np.loadtxt(fh, delimiter=",", dtype=np.float32)
    x_ND = table[:, :-1] / 16.0  # pixel intensities are 0..16
    y_N = table[:, -1].astype(np.int64)
    return Dataset(
        x_ND=torch.from_numpy(np.ascontiguousarray(x_ND)),
        y_N=torch.from_numpy(y_N),
        name=f"scikit-learn digits, {x_ND.shape[0]} x {x_ND.shape[1]} (bundled, no download)",
    )
