"""Progressive-validation metrics in NumPy: AUC, log loss, calibration."""

from typing import Dict

import numpy as np


def roc_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve (ties count one half); NaN without both classes."""
    labels = np.asarray(labels, np.float64).reshape(-1) > 0.5
    scores = np.asarray(scores, np.float64).reshape(-1)
    positives = int(labels.sum())
    negatives = len(labels) - positives
    if positives == 0 or negatives == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    sorted_scores = scores[order]
    ranks = np.empty(len(scores), np.float64)
    # average rank of each run of equal scores
    starts = np.flatnonzero(np.r_[True, sorted_scores[1:] != sorted_scores[:-1]])
    ends = np.r_[starts[1:], len(scores)]
    average = (starts + ends + 1) / 2.0
    ranks[order] = np.repeat(average, ends - starts)
    return float((ranks[labels].sum() - positives * (positives + 1) / 2.0)
                 / (positives * negatives))


def evaluate(labels: np.ndarray, logits: np.ndarray) -> Dict[str, float]:
    """{"auc", "logloss", "calibration" (mean prediction / mean label), "rows"}."""
    labels = np.asarray(labels, np.float64).reshape(-1)
    logits = np.asarray(logits, np.float64).reshape(-1)
    if len(labels) == 0:
        return {"auc": float("nan"), "logloss": float("nan"), "calibration": float("nan"),
                "rows": 0}
    loss = np.maximum(logits, 0) - logits * labels + np.log1p(np.exp(-np.abs(logits)))
    prob = 1.0 / (1.0 + np.exp(-logits))
    mean_label = labels.mean()
    return {"auc": roc_auc(labels, prob), "logloss": float(loss.mean()),
            "calibration": float(prob.mean() / mean_label) if mean_label > 0 else float("nan"),
            "rows": int(len(labels))}
