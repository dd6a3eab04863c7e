"""A stand-in for a lab's own trainer: it appends to a JSONL metrics log under its own key names
(`iter`, `tokens_seen`, `train/loss`, `eval/loss`, `time`) as a trainer logs while it runs, so that
`delphi prereg check --watch` can be tried on a live log without a GPU. It trains nothing: its eval
loss follows a power law in tokens that ends at `--final-loss`.

    python docs/examples/simulated_trainer.py --log hero.jsonl --tokens 1.6e11 --final-loss 1.99
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

LOSS_EXPONENT = 0.3  # the curve's decay in tokens, L(t) = final + excess * (t / T)^-0.3 (a typical shape)
START_EXCESS = 0.15  # the loss at the first eval above the final loss, relative to the final loss


def eval_loss(tokens: float, tokens_total: float, final_loss: float, first_tokens: float) -> float:
    """The curve's eval loss after `tokens` of `tokens_total`: a power law through
    final * (1 + START_EXCESS) at the first eval and `final_loss` at the end."""
    scale = START_EXCESS * final_loss / ((first_tokens / tokens_total) ** -LOSS_EXPONENT - 1.0)
    return final_loss + scale * ((tokens / tokens_total) ** -LOSS_EXPONENT - 1.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log", type=Path, required=True, help="the JSONL log to append to")
    parser.add_argument("--tokens", type=float, required=True, help="the run's training tokens")
    parser.add_argument("--final-loss", type=float, required=True, help="the eval loss at the last step")
    parser.add_argument("--steps", type=int, default=1000, help="optimizer steps in all")
    parser.add_argument("--evals", type=int, default=10, help="evaluations, evenly spaced, the last at the end")
    parser.add_argument("--seconds-per-eval", type=float, default=0.5, help="wall time between evaluations")
    args = parser.parse_args()

    tokens_per_step = args.tokens / args.steps
    eval_steps = [round(args.steps * (i + 1) / args.evals) for i in range(args.evals)]
    first_tokens = eval_steps[0] * tokens_per_step
    with args.log.open("a") as log:
        for step in eval_steps:
            tokens = step * tokens_per_step
            loss = eval_loss(tokens, args.tokens, args.final_loss, first_tokens)
            rows = [
                {"iter": step, "tokens_seen": tokens, "train/loss": loss * 1.01, "time": time.time()},
                {"iter": step, "tokens_seen": tokens, "eval/loss": loss, "time": time.time()},
            ]
            for row in rows:
                log.write(json.dumps(row) + "\n")
            log.flush()
            time.sleep(args.seconds_per_eval)


if __name__ == "__main__":
    main()
