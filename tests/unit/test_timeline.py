"""`runs show --timeline`: the steps as bars on one time scale."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from masterplanner.cli.timeline import timeline_lines


def step(step_id: str, status: str, start: int | None, end: int | None, **more: Any) -> dict[str, Any]:
    def at(second: int | None) -> str | None:
        return None if second is None else f"2026-11-25T10:00:{second:02d}.000Z"

    return {"id": step_id, "status": status, "started_at": at(start), "finished_at": at(end)} | more


def test_bars_share_one_scale_and_name_where_each_step_ran() -> None:
    steps = [
        step("a", "succeeded", 0, 2),
        step("b", "failed", 2, 6, sub_steps=[step("b--x", "succeeded", 2, 4)]),
        step("c", "skipped", None, None),
    ]
    lines = timeline_lines(steps, {"a": "host:1:w1", "b": "host:2:w2"}, width=80, now=0.0)
    assert lines == [  # the bars take the width the processes' column leaves
        "        0 s                                 6.0 s",
        "a       ██████████████                             succeeded    2.0 s  host:1:w1",
        "b                     ▓▓▓▓▓▓▓▓▓▓▓▓▓▓▓▓▓▓▓▓▓▓▓▓▓▓▓  failed       4.0 s  host:2:w2",
        "  b--x                █████████████                succeeded    2.0 s",
        "c                                                  skipped",
    ]


def test_a_running_step_ends_now_and_a_run_with_no_start_says_so() -> None:
    now = datetime(2026, 11, 25, 10, 0, 4, tzinfo=UTC).timestamp()
    assert timeline_lines([step("a", "running", 0, None)], {}, width=50, now=now) == [
        "   0 s                   4.0 s",
        "a  ▒▒▒▒▒▒▒▒▒▒▒▒▒▒▒▒▒▒▒▒▒▒▒▒▒▒▒  running      4.0 s",
    ]
    assert timeline_lines([step("a", "pending", None, None)], {}, width=50, now=now) == [
        "no step has started"
    ]
    assert timeline_lines([], {}, width=50, now=now) == ["no steps"]


LONG = "extract-quarterly-revenue-from-report"


def test_long_ids_are_cut_with_an_ellipsis_and_stay_apart_and_replaced_steps_look_replaced() -> None:
    """Before, ids were cut to 24 characters with no marker (`…-report-1` and `-2` looked the same)
    and a replaced step had a success's solid bar."""
    steps = [
        step(f"{LONG}-1", "succeeded", 0, 3),
        step(f"{LONG}-2", "replaced", 1, 4),
        step("b", "skipped", None, None),
    ]
    assert timeline_lines(steps, {f"{LONG}-1": "host:1:w1"}, width=80, now=0.0) == [
        "                          0 s               4.0 s",
        "extract-qua…rom-report-1  █████████████████        succeeded    3.0 s  host:1:w1",
        "extract-qua…rom-report-2        ▚▚▚▚▚▚▚▚▚▚▚▚▚▚▚▚▚  replaced     3.0 s",
        "b                                                  skipped",
    ]
    # ids that differ only in the middle: the labels widen until they differ
    twins = [step(f"fetch-sales-{side}-region-2024", "succeeded", 0, 1) for side in ("north", "south")]
    labels = [line.split("  ")[0] for line in timeline_lines(twins, {}, width=80, now=0.0)[1:]]
    assert labels == ["fetch-sales-n…h-region-2024", "fetch-sales-s…h-region-2024"]


def test_a_narrow_terminal_gets_lines_no_wider_than_it() -> None:
    """Before, COLUMNS=40 gave lines of ~70 characters, wrapped by the terminal off the scale."""
    steps = [step(f"{LONG}-1", "succeeded", 0, 3), step(f"{LONG}-2", "failed", 1, 4)]
    assert timeline_lines(steps, {f"{LONG}-1": "host:1:w1"}, width=40, now=0.0) == [
        "          0 s  4.0 s",
        "ext…rt-1  ████████    succeeded    3.0 s",
        "          host:1:w1",
        "ext…rt-2    ▓▓▓▓▓▓▓▓  failed       3.0 s",
    ]


def test_long_steps_keep_the_columns_and_the_width() -> None:
    """A step of hours took `11995.0 s`, wider than its column of 8: the rows' ends no longer lined
    up (nor the processes after them), and in a narrow terminal a row outgrew the width."""

    def at(second: int) -> str:
        return datetime.fromtimestamp(1_795_600_800 + second, UTC).isoformat()

    steps = [
        {"id": "a", "status": "succeeded", "started_at": at(0), "finished_at": at(5)},
        {"id": "b", "status": "failed", "started_at": at(5), "finished_at": at(11_995)},
        {"id": "c", "status": "running", "started_at": at(11_995), "finished_at": None},
    ]
    now = 1_795_600_800 + 37_000.4  # c still going
    assert timeline_lines(steps, {"a": "host:1:w1", "b": "host:2:w2"}, width=60, now=now) == [
        "   0 s                10h 17m",
        "a  █                           succeeded    5.0 s  host:1:w1",
        "b  ▓▓▓▓▓▓▓▓                    failed      3h 20m  host:2:w2",
        "c          ▒▒▒▒▒▒▒▒▒▒▒▒▒▒▒▒▒▒  running     6h 57m",
    ]
    minutes = [step("m", "succeeded", 0, None, finished_at="2026-11-25T10:04:05.000Z")]
    assert timeline_lines(minutes, {}, width=40, now=0.0) == [
        "   0 s        4m 05s",
        "m  █████████████████  succeeded   4m 05s",
    ]


def test_a_process_name_on_a_line_of_its_own_is_cut_to_the_terminal() -> None:
    """In a narrow terminal the process went under its step but kept its whole length (a step
    resumed elsewhere names two): the terminal wrapped it off the chart's left edge."""
    where = "build-host-07.example.com:31337:w1 → build-host-09.example.com:4242:w2"
    lines = timeline_lines([step("a", "succeeded", 0, 3)], {"a": where}, width=40, now=0.0)
    assert lines == [
        "   0 s         3.0 s",
        "a  █████████████████  succeeded    3.0 s",
        "   build-host-07.exam…xample.com:4242:w2",
    ]
