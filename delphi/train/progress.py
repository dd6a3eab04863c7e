"""The progress bar (tqdm on stderr): step, loss, tokens/s, ETA, and with a
preregistration the predicted loss at the current token count beside the
actual one, so a hero run can be watched against its prediction live.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

# tokens -> predicted eval loss: a number, or a band with .median/.lo90/.hi90. The caller builds it
# (e.g. delphi.prereg_format.predicted_loss_curve from a preregistration), so training never
# depends on how predictions are stored.
PredictedLoss = Callable[[float], Any]


def format_prediction(predicted) -> str:
    """A band (median, lo90, hi90) as "1.234 [1.200, 1.270]"; a plain number as "1.2340"."""
    if hasattr(predicted, "lo90"):
        return f"{predicted.median:.4f} [{predicted.lo90:.4f}, {predicted.hi90:.4f}]"
    return f"{float(predicted):.4f}"


class Progress:
    def __init__(
        self, steps: int, start_step: int, tokens_per_step: int, predicted_loss: PredictedLoss | None, *, enabled: bool
    ) -> None:
        self.tokens_per_step = tokens_per_step
        self.predicted_loss = predicted_loss
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=steps, initial=start_step, unit="step", dynamic_ncols=True, desc="train")

    def advance(self, steps: int) -> None:
        if self.bar is not None:
            self.bar.update(steps)

    def show(self, record: dict) -> None:
        if self.bar is None:
            return
        postfix = {"loss": f"{record['train_loss']:.4f}", "tok/s": f"{record['tokens_per_s']:,.0f}"}
        if record.get("val_loss") is not None:
            postfix["val"] = f"{record['val_loss']:.4f}"
        predicted = self.predicted_loss(record["tokens"]) if self.predicted_loss is not None else None
        if predicted is not None and not math.isnan(
            getattr(predicted, "median", predicted)
        ):  # NaN: before the first predicted point
            postfix["pred"] = format_prediction(predicted)
        self.bar.set_postfix(postfix, refresh=False)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
