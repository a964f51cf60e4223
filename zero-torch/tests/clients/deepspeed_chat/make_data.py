"""Writes DeepSpeed-Chat's ``local/jsonfile`` data (``data/train.json``, ``data/eval.json``,
JSON Lines of ``prompt``/``chosen``/``rejected``): short synthetic question-and-answer
records from a fixed word list and seed, in place of the Hub datasets the script would
download. Run once; its output is committed."""

import json
import os
import random

WORDS = ["red", "blue", "green", "cat", "dog", "bird", "tree", "sun", "moon", "star", "fish", "car"]


def record(rng):
    a, b = rng.sample(WORDS, 2)
    return {"prompt": f"Human: what goes with {a} ? Assistant:",
            "chosen": f"the {a} goes with the {b} .",
            "rejected": f"no {a} here ."}


def main():
    rng = random.Random(1234)
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
    os.makedirs(here, exist_ok=True)
    for name, n in (("train", 24), ("eval", 8)):
        with open(os.path.join(here, f"{name}.json"), "w", encoding="utf-8") as f:
            for _ in range(n):
                f.write(json.dumps(record(rng)) + "\n")


if __name__ == "__main__":
    main()
