"""Redaction benchmark: what taking secrets out of a tool's result costs, as passes over the text.

    python bench/redaction.py [--megabytes 1] [--repeat 5] [--json]

Every tool result (a file read, an HTTP body, a program's output) is redacted before the model,
the events or a checkpoint see it, on the event loop. A megabyte of mixed text (code, JSON,
`.env` lines, HTTP headers, near-misses of each rule) and three texts that run to their end after
a name a rule reads (a passphrase's, a list's, a quoted token's: the shapes a rule that scanned
to the end at every position, or backtracked, would be slow on), and two that once were slow
(a long run of name parts, `a_a_a_…`, and of URL starts, `x://u:x://u:…`) go through `redacted`,
`redacted_content` and `secret_parts`. The anchor, timed in the same run on the same texts, is
one pass of a plain word-finding regular expression (`re.findall(r"\\w+")`): each figure is the
best of --repeat runs divided by the anchor's best, i.e. how many such passes redaction costs.
A rule that reads each position to the end makes its figure grow with the text's length (run
with --megabytes 2 and compare): the figure should stay about the same.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections.abc import Callable

from masterplanner.redaction import redacted, redacted_content, secret_parts

_MIXED = "".join(
    [
        'x = config.api_key; password = user.password; token = "short"\n',
        '{"password": ["can\'t be blank", "ok"], "secret": 12, "api_key": "created_at", "key": "a"}\n',
        "Authorization: Bearer scheme\nSECRET_KEY_ID=abc\nsort_token: 'a_b_c'\n",
        "DB_PASSWORD=hunter2hunter2\nheaders = {'Authorization': f'Basic {encoded}'}\n",
        '"password": "one two three four five six seven eight nine ten eleven"\n',
        '{"token": [' + '"aaaaaaaaaaaaaaaaaaaaaaa", ' * 10 + "\n",
        "def read(path):\n    with open(path) as f:\n        return f.read()  # plain code\n",
    ]
)


def texts(megabytes: float) -> dict[str, str]:
    size = int(megabytes * 1_000_000)
    return {
        "mixed": _MIXED * (size // len(_MIXED)),
        "open phrase": '{"password": "' + "ab " * (size // 3),
        "open list": '{"token": [' + '"a", ' * (size // 5),
        "open quoted name": 'sort_token: "' + "a_" * (size // 2),
        # once slow: a name's parts tried from every part (16 KB of `a_` took 8 s), and a URL's
        # password read to the last `@` of its token (`x://u:` repeated took seconds)
        "name parts": "a_" * (size // 2),
        "url starts": "x://u:" * (size // 6),
    }


def best(call: Callable[[str], object], text: str, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        call(text)
        times.append(time.perf_counter() - started)
    return min(times)


def _anchor(text: str) -> object:
    return re.findall(r"\w+", text)


def measure(megabytes: float, repeat: int) -> dict[str, dict[str, float]]:
    figures: dict[str, dict[str, float]] = {}
    for name, text in texts(megabytes).items():
        anchor = best(_anchor, text, repeat)
        row = {"anchor_ms": round(anchor * 1000, 2)}
        for call in (redacted, redacted_content, secret_parts):
            row[call.__name__] = round(best(call, text, repeat) / anchor, 2)
        figures[name] = row
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=float, default=1.0)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    figures = measure(args.megabytes, args.repeat)
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    for name, row in figures.items():
        ratios = ", ".join(f"{call} {ratio}" for call, ratio in row.items() if call != "anchor_ms")
        print(f"{name} ({args.megabytes:g} MB): anchor {row['anchor_ms']} ms; ratio {ratios}")


if __name__ == "__main__":
    main()
