"""The web app in a real browser: Playwright driving Debian's Chromium headless, against `serve`.

Screenshots of the review and the live run are saved in `test-artifacts/` (or
MASTERPLANNER_TEST_ARTIFACTS) for a person to look at.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from _serve import serving

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(os.environ.get("MASTERPLANNER_TEST_ARTIFACTS", Path(__file__).parents[2] / "test-artifacts"))


def _missing() -> str | None:
    if not Path(CHROMIUM).exists():
        return f"{CHROMIUM} is missing (apt-get install -y chromium)"
    try:
        import playwright  # noqa: F401
    except ImportError:
        return "playwright is missing (pip install -e '.[dev]')"
    return None


@pytest.fixture
def browser_page() -> Iterator[Any]:
    missing = _missing()
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"the browser test cannot run in CI: {missing}")
        pytest.skip(missing)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as driver:
        browser = driver.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        page = browser.new_page(viewport={"width": 1280, "height": 1000})
        page.set_default_timeout(60_000)
        yield page
        browser.close()


@pytest.fixture
def server(isolated: Path) -> Iterator[str]:
    with serving(isolated / "serve.log") as url:
        yield url


def _step(step_id: str, *deps: str, tools: list[str]) -> dict[str, Any]:
    return {
        "id": step_id,
        "title": f"Do {step_id}",
        "instruction": f"Do {step_id}.",
        "agent_role": "writer",
        "tools": tools,
        "depends_on": list(deps),
        "expected_output": f"{step_id} done",
    }


def test_review_edit_approve_answer_inline_and_open_the_written_file(
    server: str, browser_page: Any, write_script: Callable[..., Path]
) -> None:
    page = browser_page
    script = write_script(
        [
            {
                "purpose": "planner",
                "output": {
                    "steps": [
                        _step("draft", tools=["read_file", "write_file"]),
                        _step("report", "draft", tools=["delete_file", "write_file"]),
                    ]
                },
            },
            {"purpose": "prompt_creator", "output": "You are a careful writer. Do the step.", "repeat": True},
            {
                "purpose": "critic",
                "output": {"clarity": 4, "completeness": 4, "tool_fit": 3, "output_format": 5, "defects": []},
                "repeat": True,
            },
            {
                "purpose": "step:draft",
                "tool_calls": [{"name": "write_file", "args": {"path": "draft.txt", "content": "d"}}],
            },
            {"purpose": "step:draft", "output": "drafted"},
            # the prompt edited in the browser is what the report step's agent gets
            {
                "purpose": "step:report",
                "expect": ["Write the final report, politely."],
                "tool_calls": [{"name": "delete_file", "args": {"path": "draft.txt"}}],
            },
            {
                "purpose": "step:report",
                "tool_calls": [
                    {"name": "write_file", "args": {"path": "report.txt", "content": "the final report"}}
                ],
            },
            {"purpose": "step:report", "output": "reported"},
            {"purpose": "*", "output": "done", "repeat": True},
        ]
    )
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.goto(f"{server}/new")
    page.get_by_label("Task").fill("Draft, then write the final report")
    page.get_by_label("Model", exact=True).fill(f"scripted:{script}")
    page.get_by_role("button", name="Plan it").click()
    page.get_by_role("heading", name="Review the plan").wait_for()
    assert page.locator("svg.plan-graph g.node").count() == 2
    assert page.locator("svg.plan-graph line.edge").count() == 1

    draft_tools = page.locator("#card-draft")
    draft_tools.get_by_role("checkbox", name="read_file").uncheck()
    page.get_by_label("Agent prompt").nth(1).fill("Write the final report, politely.")
    page.screenshot(path=str(ARTIFACTS / "review.png"), full_page=True)
    page.locator("#review-form").get_by_role("button", name="Approve").click()

    page.get_by_text("wants to call").wait_for()
    assert page.locator("code", has_text="delete_file").count() == 1
    page.screenshot(path=str(ARTIFACTS / "live.png"), full_page=True)
    page.locator("section.request").get_by_role("button", name="Approve").click()

    page.locator(".status-succeeded", has_text="succeeded").first.wait_for()
    page.get_by_role("link", name="report.txt").click()
    assert page.locator("body").inner_text().strip() == "the final report"
    page.go_back()
    page.get_by_role("radio", name="5").check()
    page.get_by_label("What would you change? (optional)").fill("Just right.")
    page.get_by_role("button", name="Rate").click()
    page.get_by_role("status").filter(has_text="Rated 5/5").wait_for()
    page.screenshot(path=str(ARTIFACTS / "done.png"), full_page=True)

    run_id = page.url.split("/")[4]
    report = json.loads(urllib.request.urlopen(f"{server}/api/v1/runs/{run_id}").read())
    assert report["status"] == "succeeded"
    tools = [step["tools"] for step in report["plan"]["steps"]]
    assert tools == [["write_file"], ["delete_file", "write_file"]]  # read_file unticked
    events = json.loads(urllib.request.urlopen(f"{server}/api/v1/runs/{run_id}/events").read())
    kinds = [event["kind"] for event in events]
    assert kinds.count("tool_approved") == 1 and "tool_denied" not in kinds


@pytest.mark.postgres
def test_a_queued_runs_waiting_line_follows_the_workers_with_no_event_of_the_run(
    postgres_database: str, isolated: Path, browser_page: Any, write_script: Callable[..., Path]
) -> None:
    """A worker starting is no event of the run's, yet its page says what the run now waits for."""
    page = browser_page
    script = write_script(
        [
            {"purpose": "planner", "output": {"steps": [_step("a", tools=[])]}, "repeat": True},
            {"purpose": "step:a", "output": "from a worker"},
            {"purpose": "*", "repeat": True},
        ]
    )
    env = {
        **os.environ,
        "MASTERPLANNER_DATABASE_URL": postgres_database,
        "MASTERPLANNER_EMBEDDER": "none",
        "MASTERPLANNER_REMEMBER_RUNS": "never",
        "MASTERPLANNER_REUSE_THRESHOLD": "1.01",
    }
    workers: list[subprocess.Popen[bytes]] = []

    def worker(provider: str) -> None:
        log = (isolated / f"worker-{provider}.log").open("w")
        command = [sys.executable, "-m", "masterplanner", "worker", "--queues", provider]
        workers.append(subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT))

    def events(url: str, run_id: str) -> list[str]:
        with urllib.request.urlopen(f"{url}/api/v1/runs/{run_id}/events", timeout=30) as response:
            return [event["kind"] for event in json.loads(response.read())]

    try:
        with serving(isolated / "serve.log", "--workers", env=env) as url:
            body = {"task": "one step", "model": f"scripted:{script}", "options": {"auto_approve": True}}
            data, headers = json.dumps(body).encode(), {"Content-Type": "application/json"}
            request = urllib.request.Request(f"{url}/api/v1/runs", data=data, headers=headers)
            with urllib.request.urlopen(request, timeout=30) as response:
                run_id = json.loads(response.read())["id"]
            page.goto(f"{url}/runs/{run_id}")
            waiting = page.locator("p.waiting")
            waiting.filter(has_text="no worker is running on this database").wait_for()
            before = events(url, run_id)
            worker("local")  # a worker, but not one for scripted runs
            waiting.filter(has_text="no worker running on this database takes scripted runs").wait_for(
                timeout=30_000
            )
            assert events(url, run_id) == before  # the page refreshed with no event of the run
            worker("scripted")
            page.locator(".status-succeeded", has_text="succeeded").first.wait_for()
            assert waiting.count() == 0
    finally:
        for process in workers:
            process.terminate()
            process.wait(timeout=60)


def test_a_failed_run_is_retried_from_its_page_and_followed_live(
    server: str, browser_page: Any, tmp_path: Path
) -> None:
    """The retry button loads the page again, which follows the run live to its new end.

    Another tab on the failed run notices the retry within 5 s and loads again too.
    """
    page = browser_page
    script = tmp_path / "script.json"
    broken = {"purpose": "step:b", "tool_calls": [{"name": "no_such_tool", "args": {}}], "repeat": True}
    calls = [
        {"purpose": "planner", "output": {"steps": [_step("a", tools=[]), _step("b", "a", tools=[])]}},
        {"purpose": "step:a", "output": "A"},
        broken,
        {"purpose": "*", "repeat": True},
    ]
    script.write_text(json.dumps({"calls": calls}))
    body = {
        "task": "a then b",
        "model": f"scripted:{script}",
        "options": {"auto_approve": True, "prompt_rounds": 0, "max_replans": 0, "max_model_calls": 13},
    }
    data, headers = json.dumps(body).encode(), {"Content-Type": "application/json"}
    request = urllib.request.Request(f"{server}/api/v1/runs", data=data, headers=headers)
    with urllib.request.urlopen(request, timeout=30) as response:
        run_id = json.loads(response.read())["id"]
    page.goto(f"{server}/runs/{run_id}")
    page.locator("h1 .status-failed").wait_for()

    retry = page.get_by_role("button", name="Retry from where it failed")
    retry.click()  # its model-call budget is used up: refused, and the page says so
    page.get_by_role("alert").filter(
        has_text="the run used its budget of 13 model calls; retry it with a larger budget"
    ).wait_for()
    assert page.locator("h1 .status-failed").count() == 1

    script.write_text(json.dumps({"calls": [{"purpose": "step:b", "delay_s": 1.5, "output": "B at last"}]}))
    other = page.context.browser.new_page()  # a second tab on the run, which nobody touches
    other.goto(f"{server}/runs/{run_id}")
    other.locator("h1 .status-failed").wait_for()
    # the refusal left the budgets open: fill one in
    page.get_by_label("Model calls for the whole run").fill("20")
    retry.click()
    page.locator("h1 .status-running").wait_for()  # the page again, live
    page.locator("h1 .status-succeeded").wait_for()
    assert page.locator("pre.output").inner_text() == "B at last"
    other.locator("h1 .status-succeeded").wait_for(timeout=30_000)  # it noticed the retry, loaded again
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "retried-run.png"), full_page=True)


def _api_run(server: str, script: Path, task: str, options: dict[str, Any], token: str | None = None) -> str:
    body = {"task": task, "model": f"scripted:{script}", "options": {"prompt_rounds": 0, **options}}
    data, headers = json.dumps(body).encode(), {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(f"{server}/api/v1/runs", data=data, headers=headers)
    with urllib.request.urlopen(request, timeout=30) as response:
        run_id: str = json.loads(response.read())["id"]
    return run_id


def test_what_the_person_types_survives_the_page_following_the_run(
    server: str, browser_page: Any, tmp_path: Path
) -> None:
    """An answer being typed stays while other steps finish; an edited replan too, the page live around it."""
    page = browser_page
    script = tmp_path / "script.json"
    calls = [
        {"purpose": "planner", "output": {"steps": [_step("q", tools=["ask_user"]), _step("c", tools=[])]}},
        {"purpose": "step:q", "tool_calls": [{"name": "ask_user", "args": {"question": "Which colour?"}}]},
        {"purpose": "step:q", "expect": ["teal, on reflection"], "output": "Q"},
        {"purpose": "step:c", "delay_s": 3, "output": "C"},
        {"purpose": "*", "repeat": True},
    ]
    script.write_text(json.dumps({"calls": calls}))
    page.goto(f"{server}/runs/{_api_run(server, script, 'ask and wait', {'auto_approve': True})}")
    answer = page.get_by_role("textbox", name="Which colour?")
    answer.fill("teal, on reflection")
    page.locator("tr.status-succeeded", has_text="c").wait_for()  # the body was fetched again
    assert answer.input_value() == "teal, on reflection"
    page.get_by_role("button", name="Answer").click()
    page.locator("h1 .status-succeeded").wait_for()

    # a replan reviewed while another step still runs: that step's end does not undo the edit
    broken = {"purpose": "step:a", "tool_calls": [{"name": "no_such_tool", "args": {}}], "repeat": True}
    replanned = {"purpose": "replanner", "output": {"steps": [_step("a2", tools=[])]}}
    calls = [
        {"purpose": "planner", "output": {"steps": [_step("a", tools=[]), _step("b", tools=[])]}},
        broken,
        {"purpose": "step:b", "delay_s": 8, "output": "B"},  # a fails three times meanwhile
        replanned | {"repeat": True},
        {"purpose": "step:a2", "output": "A2"},
        {"purpose": "*", "repeat": True},
    ]
    script.write_text(json.dumps({"calls": calls}))
    run_id = _api_run(server, script, "replan while b runs", {"auto_approve": False})
    page.goto(f"{server}/runs/{run_id}")
    page.locator("#review-form").get_by_role("button", name="Approve").click()
    page.get_by_role("heading", name="Replan: step a failed").wait_for()
    title = page.get_by_label("Title").first
    title.fill("Do a again, carefully")
    assert page.locator("tr.status-running", has_text="b").count() == 1
    # b ends: the page shows it and keeps the edit (the replan is still the one to answer: no note)
    page.locator("tr.status-succeeded", has_text="b").wait_for()
    assert (title.input_value(), page.locator("#run-changed").is_hidden()) == ("Do a again, carefully", True)
    page.locator("#review-form").get_by_role("button", name="Approve").click()
    page.locator("h1 .status-succeeded").wait_for()
    with urllib.request.urlopen(f"{server}/api/v1/runs/{run_id}", timeout=30) as response:
        steps = json.loads(response.read())["plan"]["steps"]
    assert [(step["id"], step["title"]) for step in steps] == [("a2", "Do a again, carefully"), ("b", "Do b")]


def test_typing_in_a_held_part_goes_on_through_a_refresh_in_a_browser_without_move_before(
    server: str, browser_page: Any, tmp_path: Path
) -> None:
    """Where HTMX puts a kept part back by taking it out and in again, the focus and caret come back."""
    page = browser_page
    page.add_init_script(  # as in browsers without Element.moveBefore (before Chromium 133, Safari)
        "for (const kind of [Element, Document, DocumentFragment]) delete kind.prototype.moveBefore;"
    )
    script = tmp_path / "script.json"
    calls = [
        {"purpose": "planner", "output": {"steps": [_step("a", tools=[]), _step("b", tools=[])]}},
        {"purpose": "step:a", "tool_calls": [{"name": "no_such_tool", "args": {}}], "repeat": True},
        {"purpose": "step:b", "delay_s": 8, "output": "B"},  # a fails three times meanwhile
        {"purpose": "replanner", "output": {"steps": [_step("a2", tools=[])]}, "repeat": True},
        {"purpose": "step:a2", "output": "A2"},
        {"purpose": "*", "repeat": True},
    ]
    script.write_text(json.dumps({"calls": calls}))
    run_id = _api_run(server, script, "typing through a refresh", {"auto_approve": False})
    page.goto(f"{server}/runs/{run_id}")
    page.locator("#review-form").get_by_role("button", name="Approve").click()
    page.get_by_role("heading", name="Replan: step a failed").wait_for()
    assert page.evaluate("typeof Element.prototype.moveBefore") == "undefined"
    title = page.get_by_label("Title").first
    title.fill("Do a again")
    title.press("Home")  # the caret at the start, where the next keys go
    page.locator("tr.status-succeeded", has_text="b").wait_for()  # the body was fetched again
    page.keyboard.type("Now: ")
    assert title.input_value() == "Now: Do a again"


def test_a_refused_edit_keeps_what_was_typed_and_the_page_still_follows_the_run(
    server: str, browser_page: Any, tmp_path: Path
) -> None:
    """A 422 is about the person's input, not the run: the run's progress goes on showing."""
    page = browser_page
    script = tmp_path / "script.json"
    broken = {"purpose": "step:a", "tool_calls": [{"name": "no_such_tool", "args": {}}], "repeat": True}
    calls = [
        {"purpose": "planner", "output": {"steps": [_step("a", tools=[]), _step("b", tools=[])]}},
        broken,
        {"purpose": "step:b", "delay_s": 10, "output": "B"},  # a fails three times meanwhile
        {"purpose": "replanner", "output": {"steps": [_step("a2", tools=[])]}, "repeat": True},
        {"purpose": "step:a2", "output": "A2"},
        {"purpose": "*", "repeat": True},
    ]
    script.write_text(json.dumps({"calls": calls}))
    page.goto(f"{server}/runs/{_api_run(server, script, 'a refused replan edit', {'auto_approve': False})}")
    page.locator("#review-form").get_by_role("button", name="Approve").click()
    page.get_by_role("heading", name="Replan: step a failed").wait_for()
    after = page.get_by_label("After (step ids, comma-separated; empty: starts at once)").first
    after.fill("nowhere")
    page.locator("#review-form").get_by_role("button", name="Approve").click()
    refusal = page.locator("section.review").get_by_role("alert").filter(has_text="nowhere").first
    refusal.wait_for()
    assert page.locator("tr.status-running", has_text="b").count() == 1
    # b ends meanwhile: the page shows it, the refused edit and why stay as they were
    page.locator("tr.status-succeeded", has_text="b").wait_for(timeout=30_000)
    assert (after.input_value(), refusal.is_visible()) == ("nowhere", True)
    assert page.locator("#run-changed").is_hidden()  # the run did not change what they answer
    after.fill("")
    page.locator("#review-form").get_by_role("button", name="Approve").click()
    page.locator("h1 .status-succeeded").wait_for(timeout=30_000)
    assert page.locator("tr.status-succeeded", has_text="a2").count() == 1


def test_an_answer_the_run_moved_past_stays_on_the_page_which_still_follows_the_run(
    server: str, browser_page: Any, tmp_path: Path
) -> None:
    """A 409 (answered elsewhere): the run's progress goes on showing, the edit kept, the latest offered."""
    page = browser_page
    script = tmp_path / "script.json"
    calls = [
        {"purpose": "planner", "output": {"steps": [_step("a", tools=[]), _step("b", "a", tools=[])]}},
        {"purpose": "step:a", "output": "A"},
        {"purpose": "step:b", "delay_s": 3, "output": "B"},
        {"purpose": "*", "repeat": True},
    ]
    script.write_text(json.dumps({"calls": calls}))
    run_id = _api_run(server, script, "reviewed twice", {"auto_approve": False})
    page.goto(f"{server}/runs/{run_id}")
    page.get_by_role("heading", name="Review the plan").wait_for()
    title = page.get_by_label("Title").first
    title.fill("Do a, my way")
    with urllib.request.urlopen(f"{server}/api/v1/requests?run_id={run_id}", timeout=30) as response:
        review_id = json.loads(response.read())[0]["id"]
    data, headers = json.dumps({"approve": True}).encode(), {"Content-Type": "application/json"}
    answer = f"{server}/api/v1/requests/{review_id}/answer"
    elsewhere = urllib.request.Request(answer, data=data, headers=headers)
    urllib.request.urlopen(elsewhere, timeout=30).close()
    changed = page.locator("#run-changed")
    changed.wait_for()  # the review they edit was answered elsewhere: said, and their edit kept
    page.locator("#review-form").get_by_role("button", name="Approve").click()
    page.get_by_role("alert").filter(has_text="yours was not taken").wait_for()
    # the run goes on to its end on the page, around their edit and the offer of the latest
    page.locator("h1 .status-succeeded").wait_for(timeout=30_000)
    assert page.locator("tr.status-succeeded", has_text="b").count() == 1
    assert (title.input_value(), changed.is_visible()) == ("Do a, my way", True)
    assert page.get_by_role("alert").filter(has_text="yours was not taken").is_visible()
    page.get_by_role("button", name="Show the latest").click()
    page.locator("#review-form").wait_for(state="detached")
    assert changed.is_hidden() and page.locator("pre.output").count() == 1


def test_texts_beginning_with_a_line_break_are_sent_back_whole_by_the_browser(
    server: str, browser_page: Any, tmp_path: Path
) -> None:
    """HTML drops the line break right after `<textarea>`: the review approved as shown was an edit."""
    page = browser_page
    instruction, prompt = "\nRead the report.", "You are a worker.\nDo the step."
    script = tmp_path / "script.json"
    calls = [
        {"purpose": "planner", "output": {"steps": [_step("a", tools=[]) | {"instruction": instruction}]}},
        {"purpose": "prompt_creator", "output": prompt, "repeat": True},
        {"purpose": "step:a", "output": "A"},
        {"purpose": "*", "repeat": True},
    ]
    script.write_text(json.dumps({"calls": calls}))
    run_id = _api_run(server, script, "a line break first", {"auto_approve": False})
    page.goto(f"{server}/runs/{run_id}")
    page.get_by_role("heading", name="Review the plan").wait_for()
    assert page.get_by_label("Instruction").input_value() == instruction
    assert page.get_by_label("Agent prompt").input_value() == prompt
    page.locator("#review-form").get_by_role("button", name="Approve").click()
    page.locator("h1 .status-succeeded").wait_for()
    with urllib.request.urlopen(f"{server}/api/v1/runs/{run_id}", timeout=30) as response:
        report = json.loads(response.read())
    assert report["plan"]["steps"][0]["instruction"] == instruction
    assert report["agents"]["a"]["prompt"] == prompt
    with urllib.request.urlopen(f"{server}/api/v1/runs/{run_id}/events", timeout=30) as response:
        kinds = [event["kind"] for event in json.loads(response.read())]
    assert "approved" in kinds and "plan_edited" not in kinds


def test_a_review_shown_while_an_answer_is_typed_keeps_a_text_beginning_with_a_line_break(
    server: str, browser_page: Any, tmp_path: Path
) -> None:
    """The page puts what the person types in back into each refresh, and writes the refresh out again.

    Written out by the browser, a `<textarea>` lost the line break its text began with: the
    replan, shown while an answer was being typed, approved as shown changed the step's
    instruction.
    """
    page = browser_page
    instruction = "\nDo a2 with care."
    script = tmp_path / "script.json"
    broken = {"purpose": "step:a", "tool_calls": [{"name": "no_such_tool", "args": {}}], "repeat": True}
    calls = [
        {"purpose": "planner", "output": {"steps": [_step("q", tools=["ask_user"]), _step("a", tools=[])]}},
        {"purpose": "step:q", "tool_calls": [{"name": "ask_user", "args": {"question": "Which colour?"}}]},
        {"purpose": "step:q", "expect": ["teal"], "output": "Q"},
        broken,
        {"purpose": "replanner", "output": {"steps": [_step("a2", tools=[]) | {"instruction": instruction}]}},
        {"purpose": "step:a2", "output": "A2"},
        {"purpose": "*", "repeat": True},
    ]
    script.write_text(json.dumps({"calls": calls}))
    run_id = _api_run(server, script, "ask while a is replanned", {"auto_approve": False})
    page.goto(f"{server}/runs/{run_id}")
    page.locator("#review-form").get_by_role("button", name="Approve").click()
    answer = page.get_by_role("textbox", name="Which colour?")
    answer.fill("teal")  # held from now on: each refresh is written out again around it
    page.get_by_role("heading", name="Replan: step a failed").wait_for()
    assert page.locator('[name="instruction.a2"]').input_value() == instruction
    page.locator("#review-form").get_by_role("button", name="Approve").click()
    page.locator("#review-form").wait_for(state="detached")
    page.get_by_role("button", name="Answer").click()  # as the replan's burst of refreshes comes
    page.locator("h1 .status-succeeded").wait_for()
    with urllib.request.urlopen(f"{server}/api/v1/runs/{run_id}", timeout=30) as response:
        steps = json.loads(response.read())["plan"]["steps"]
    assert [(step["id"], step["instruction"]) for step in steps] == [("q", "Do q."), ("a2", instruction)]


def test_the_runs_last_events_reach_a_page_whose_refresh_was_slow(
    server: str, browser_page: Any, tmp_path: Path
) -> None:
    """Changes that come while the page fetches its body are shown once that fetch is in.

    The page's refresh took the first change of a burst and dropped the others until the body
    was back; when the body had been rendered before them and they were the run's last events,
    the page showed the run running for good (its event stream had ended).
    """
    page = browser_page
    script = tmp_path / "script.json"
    calls = [
        {"purpose": "planner", "output": {"steps": [_step("a", tools=[]), _step("b", "a", tools=[])]}},
        {"purpose": "step:a", "delay_s": 4, "output": "A"},
        {"purpose": "step:b", "delay_s": 0.2, "output": "B"},
        {"purpose": "*", "repeat": True},
    ]
    script.write_text(json.dumps({"calls": calls}))

    def slowly(route: Any) -> None:  # a slow network: the body comes 1.5 s after it was rendered
        fetched = route.fetch()
        page.wait_for_timeout(1_500)
        route.fulfill(response=fetched)

    page.route("**/body", slowly)
    page.goto(f"{server}/runs/{_api_run(server, script, 'a then b', {'auto_approve': True})}")
    page.locator("tr.status-running", has_text="a").wait_for()
    page.locator("h1 .status-succeeded").wait_for(timeout=20_000)
    assert page.locator("pre.output").inner_text() == "B"


# the run's body fetched again, as a change of the run makes the page do; done once the response is in
_REFRESH = """() => {
  const body = document.getElementById("run-body");
  return htmx.ajax("GET", body.getAttribute("hx-get"), {source: body, target: body, swap: "outerHTML"});
}"""


def _ask_script(tmp_path: Path) -> Path:
    script = tmp_path / "script.json"
    calls = [
        {"purpose": "planner", "output": {"steps": [_step("q", tools=["ask_user"])]}},
        {"purpose": "step:q", "tool_calls": [{"name": "ask_user", "args": {"question": "Which colour?"}}]},
        {"purpose": "step:q", "expect": ["teal"], "output": "Q"},
        {"purpose": "*", "repeat": True},
    ]
    script.write_text(json.dumps({"calls": calls}))
    return script


def _click_while_the_page_refreshes(page: Any, button: Any) -> None:
    """A person's click on `button` with a refresh of the body coming in between press and release."""
    from playwright.sync_api import Error as PlaywrightError

    box = None
    for _ in range(50):  # a live event may refresh the body before the press too: find it again
        try:
            button.scroll_into_view_if_needed(timeout=5_000)
            box = button.bounding_box()
        except PlaywrightError as error:  # "Element is not attached to the DOM" (seen in CI)
            if "not attached" not in str(error):
                raise
        if box is not None:
            break
        page.wait_for_timeout(100)
    assert box is not None, "the button stayed detached: the page kept refreshing"
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.mouse.down()
    page.evaluate(_REFRESH)
    page.wait_for_timeout(100)  # a refresh shown is set up by then (HTMX: 20 ms)
    page.mouse.up()


def test_a_click_made_while_the_page_refreshes_sends_its_form(
    server: str, browser_page: Any, tmp_path: Path
) -> None:
    """A refresh between the press and the release replaced (or moved) the button: no click, nothing sent.

    Seen in a clean-clone CI run: an Answer clicked while a replan's events refreshed the page
    never reached the server. The review's Approve (nothing typed: not held) went the same way.
    """
    page = browser_page
    run_id = _api_run(server, _ask_script(tmp_path), "ask once approved", {"auto_approve": False})
    page.goto(f"{server}/runs/{run_id}")
    _click_while_the_page_refreshes(page, page.locator("#review-form").get_by_role("button", name="Approve"))
    answer = page.get_by_role("textbox", name="Which colour?")
    answer.fill("teal")  # its part is held from now on: refreshes move it, not replace it
    _click_while_the_page_refreshes(page, page.get_by_role("button", name="Answer"))
    page.locator("h1 .status-succeeded").wait_for(timeout=30_000)
    with urllib.request.urlopen(f"{server}/api/v1/runs/{run_id}/events", timeout=30) as response:
        answered = [
            event["data"]["kind"]
            for event in json.loads(response.read())
            if event["kind"] == "request_answered"
        ]
    assert answered == ["plan_review", "ask_user"]


def test_a_button_clicked_before_the_refreshed_body_is_set_up_sends_its_form(
    server: str, browser_page: Any, tmp_path: Path
) -> None:
    """HTMX sets a fetched body up after its settle: a form sent before went as a page load, unanswered."""
    page = browser_page
    run_id = _api_run(
        server, _ask_script(tmp_path), "cancelled right after a refresh", {"auto_approve": True}
    )
    page.goto(f"{server}/runs/{run_id}")
    page.get_by_role("textbox", name="Which colour?").wait_for()
    page.evaluate("htmx.config.defaultSettleDelay = 5000")  # the 20 ms between swap and set-up, widened
    page.evaluate(_REFRESH)
    page.get_by_role("button", name="Cancel run").click()
    page.locator("h1 .status-cancelled").wait_for()
    assert page.url == f"{server}/runs/{run_id}"
    with urllib.request.urlopen(f"{server}/api/v1/runs/{run_id}", timeout=30) as response:
        assert json.loads(response.read())["status"] == "cancelled"


def test_an_answer_the_server_never_took_is_said_and_kept_to_send_again(
    server: str, browser_page: Any, tmp_path: Path
) -> None:
    """Not sent (the server out of reach): the page says so, and the answer stays, to send again."""
    page = browser_page
    run_id = _api_run(server, _ask_script(tmp_path), "an answer lost on the way", {"auto_approve": True})
    page.route("**/requests/*", lambda route: route.abort())
    page.goto(f"{server}/runs/{run_id}")
    answer = page.get_by_role("textbox", name="Which colour?")
    answer.fill("teal")
    page.get_by_role("button", name="Answer").click()
    unsent = page.get_by_role("alert").filter(has_text="Not sent: the server could not be reached.")
    unsent.wait_for()
    page.evaluate(_REFRESH)  # the page goes on following the run, the answer kept
    assert answer.input_value() == "teal"
    page.unroute("**/requests/*")
    page.get_by_role("button", name="Answer").click()
    page.locator("h1 .status-succeeded").wait_for(timeout=30_000)
    assert unsent.is_hidden()


def _cancelled_once_out(page: Any, out: list[Any]) -> None:
    """Once a request of the page is out and held back (in `out`), the run is cancelled from the page.

    The Cancel's response replaces the body while that request is out.
    """
    for _ in range(100):
        if out:
            break
        page.wait_for_timeout(50)
    assert out, "the request to hold back was not sent"
    page.get_by_role("button", name="Cancel run").click()
    page.locator("h1 .status-cancelled").wait_for()


def test_a_refresh_back_after_a_form_replaced_the_body_keeps_what_was_typed(
    server: str, browser_page: Any, tmp_path: Path
) -> None:
    """A refresh out while a form's response replaced the body came back for a body gone from the page.

    HTMX took what is kept on the page (what the person types) out of it for a swap that could
    not happen, and it was gone. Seen in CI: after an Approve, the Answer went without its text.
    """
    page = browser_page
    run_id = _api_run(server, _ask_script(tmp_path), "cancelled with a refresh out", {"auto_approve": True})
    page.goto(f"{server}/runs/{run_id}")
    answer = page.get_by_role("textbox", name="Which colour?")
    answer.fill("teal")  # held from now on
    held_back: list[Any] = []
    rendered: list[Any] = []

    def first_held_back(route: Any) -> None:
        if held_back:
            route.continue_()
            return
        held_back.append(route)
        rendered.append(route.fetch())  # the run as it is now: its request still open

    page.route("**/body", first_held_back)
    # sent from the document, not the body, so that no refresh of the body's own already out holds
    # it back in HTMX's queue: its response is held back
    page.evaluate(
        """() => {
      const body = document.getElementById("run-body");
      htmx.ajax("GET", body.getAttribute("hx-get"), {target: body, swap: "outerHTML"});
    }"""
    )
    _cancelled_once_out(page, rendered)
    held_back[0].fulfill(response=rendered[0])  # the run as it was, its request open
    page.wait_for_timeout(500)  # the late refresh's response is in
    assert page.evaluate("document.querySelectorAll('#--htmx-preserve-pantry--').length") == 0
    assert answer.count() == 1
    assert answer.input_value() == "teal"
    assert page.locator("#run-changed").is_visible()  # the run moved past it: said, the answer kept
    assert page.locator("h1 .status-cancelled").count() == 1  # the late refresh did not go back in time


def test_an_answer_the_server_failed_on_after_its_form_left_the_page_is_said_not_sent(
    server: str, browser_page: Any, tmp_path: Path
) -> None:
    """HTMX says a refusal to the form that was sent: one another response's swap took away heard nothing.

    An Approve out as a Cancel's response replaced the body came back 500, and the page said
    nothing: the approval looked sent.
    """
    page = browser_page
    run_id = _api_run(server, _ask_script(tmp_path), "approved, then cancelled", {"auto_approve": False})
    held_back: list[Any] = []
    page.route("**/requests/*", lambda route: held_back.append(route))
    page.goto(f"{server}/runs/{run_id}")
    page.locator("#review-form").get_by_role("button", name="Approve").click()
    _cancelled_once_out(page, held_back)
    assert page.locator("#review-form").count() == 0
    failure = json.dumps({"error": "database sqlite:///x: cannot answer a request: database or disk is full"})
    held_back[0].fulfill(status=500, content_type="application/json", body=failure)
    unsent = page.get_by_role("alert").filter(has_text="Not sent: the server failed on it (HTTP 500: ")
    unsent.wait_for()
    assert unsent.inner_text() == (
        "Not sent: the server failed on it (HTTP 500: database sqlite:///x: cannot answer a request: "
        "database or disk is full). Its form is no longer on the page (the run has moved on): answer "
        "again from the run as it is now."
    )


def _logged_in_on_a_run_page(page: Any, server: str, token: str, run_id: str) -> None:
    page.goto(f"{server}/runs/{run_id}")  # to the login page first, then on to the run's
    page.get_by_label("Token").fill(token)
    page.get_by_role("button", name="Log in").click()
    page.get_by_role("textbox", name="Which colour?").wait_for()


def _answered(server: str, token: str, run_id: str) -> list[str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(f"{server}/api/v1/runs/{run_id}/events", headers=headers)
    with urllib.request.urlopen(request, timeout=30) as response:
        events = json.loads(response.read())
    return [event["data"]["kind"] for event in events if event["kind"] == "request_answered"]


def test_a_login_ended_while_the_page_is_open_is_said_and_the_answer_sent_once_logged_in(
    isolated: Path, browser_page: Any, tmp_path: Path
) -> None:
    """The page says the login ended, keeps what was typed, and sends it once the person logs in.

    Before, a refresh followed the server's redirect and showed the login page inside the run's
    body (the typed answer gone, the login going on to the body alone); an answer sent was "not
    sent: the server answered with an error (HTTP 401)", to be sent again into the same refusal.
    """
    page = browser_page
    with serving(isolated / "serve.log", "--auth") as server:
        token = (isolated / "web-token").read_text().strip()
        script = _ask_script(tmp_path)
        run_id = _api_run(server, script, "asked as the login ends", {"auto_approve": True}, token)
        _logged_in_on_a_run_page(page, server, token, run_id)
        answer = page.get_by_role("textbox", name="Which colour?")
        answer.fill("teal")
        page.context.clear_cookies()  # the login ended: its cookie expired, or was cleared
        page.evaluate(_REFRESH)  # a change of the run: the body is fetched again
        ended = page.get_by_role("alert").filter(has_text="Your login to this server has ended")
        ended.wait_for()
        assert page.locator("#run-body").count() == 1
        assert page.get_by_role("heading", name="Log in").count() == 0  # no login page in the body
        assert page.get_by_role("heading", name=f"Run {run_id}").count() == 1
        assert answer.input_value() == "teal"

        page.get_by_role("button", name="Answer").click()
        unsent = page.get_by_role("alert").filter(has_text="Not sent: your login to this server has ended.")
        unsent.wait_for()
        page.evaluate(_REFRESH)
        assert (answer.input_value(), _answered(server, token, run_id)) == ("teal", [])

        login = page.locator("#run-login")
        login.get_by_label("Token").fill("not the token")
        login.get_by_role("button", name="Log in").click()
        wrong = "Not logged in: that is not this server's token (see the web-token file in its home directory"
        login.get_by_role("alert").filter(has_text=wrong).wait_for()
        login.get_by_label("Token").fill(token)
        login.get_by_role("button", name="Log in").click()
        page.locator("h1 .status-succeeded").wait_for(timeout=30_000)  # the answer taken: "teal", as typed
        assert (login.is_hidden(), page.url) == (True, f"{server}/runs/{run_id}")
        assert _answered(server, token, run_id) == ["ask_user"]


def test_a_page_open_when_the_server_restarts_with_a_new_token_says_to_log_in_again(
    isolated: Path, browser_page: Any, tmp_path: Path
) -> None:
    """The login cookie holds the old token: the page, its stream lost, finds that out and says so."""
    page = browser_page
    with serving(isolated / "serve.log", "--auth") as server:
        token = (isolated / "web-token").read_text().strip()
        script = _ask_script(tmp_path)
        run_id = _api_run(server, script, "open across a restart", {"auto_approve": True}, token)
        _logged_in_on_a_run_page(page, server, token, run_id)
        server.process.terminate()
        server.process.wait(timeout=30)
        (isolated / "web-token").unlink()  # the token is changed: the next server makes another
        port = int(server.rsplit(":", 1)[1])
        with serving(isolated / "serve-again.log", "--auth", port=port) as again:
            assert again == server
            ended = page.get_by_role("alert").filter(has_text="Your login to this server has ended")
            ended.wait_for()
            assert page.get_by_role("heading", name="Log in").count() == 0
            token = (isolated / "web-token").read_text().strip()
            page.locator("#run-login").get_by_label("Token").fill(token)
            page.locator("#run-login").get_by_role("button", name="Log in").click()
            ended.wait_for(state="hidden")
            assert page.get_by_role("heading", name=f"Run {run_id}").count() == 1


def _refresh_shown(page: Any) -> bool:
    """Whether a refresh of the body (a change of the run) is shown on the page at once."""
    page.evaluate("document.getElementById('run-body').dataset.before = 'refresh'")
    page.evaluate(_REFRESH)
    page.wait_for_timeout(200)  # a refresh shown is in by then
    return bool(page.evaluate("document.getElementById('run-body').dataset.before !== 'refresh'"))


def _press_on(page: Any, element: Any, button: str = "left") -> None:
    element.scroll_into_view_if_needed()
    box = element.bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.mouse.down(button=button)


def test_a_press_that_makes_no_click_does_not_stop_the_page_following_the_run(
    server: str, browser_page: Any, tmp_path: Path
) -> None:
    """A press whose release the page never sees held every refresh back, until the next click.

    A right-click's menu (opened on the press) and a `<select>`'s list (the tool policies) take
    the release; headless Chromium shows neither, so here the release is left out, as the page
    then sees it. Only a press of the primary button (or Space on a button) holds refreshes, a
    choice made in a list ends it, and a press no release ends stops holding them after 3 s.
    """
    page = browser_page
    run_id = _api_run(server, _ask_script(tmp_path), "pressed without a click", {"auto_approve": False})
    page.goto(f"{server}/runs/{run_id}")
    heading = page.get_by_role("heading", name="Review the plan")
    heading.wait_for()
    assert _refresh_shown(page)

    _press_on(page, heading, "right")  # the context menu opens and takes the release
    assert _refresh_shown(page)
    page.mouse.up(button="right")

    policy = page.get_by_label("ask_user", exact=True).last  # the run's policy for ask_user
    _press_on(page, policy)  # its list opens and takes the release
    policy.select_option("deny")  # the choice is made in the list
    assert _refresh_shown(page)
    assert page.get_by_label("ask_user", exact=True).last.input_value() == "deny"  # the edit kept
    page.mouse.up()

    _press_on(page, heading)  # a press whose release never reaches the page
    assert not _refresh_shown(page)  # held while pressed: a click may be on its way
    page.wait_for_function("document.getElementById('run-body').dataset.before !== 'refresh'", timeout=6_000)
    page.mouse.up()
    assert _refresh_shown(page)


def test_an_answer_refused_or_gone_is_said_so_and_one_taken_is_said_taken(
    server: str, browser_page: Any, tmp_path: Path
) -> None:
    """The page says what became of an answer, and whether sending it again can help.

    Every error but 409 and 422 said "not sent … send it again": a refusal as from another site
    (403) and a run no longer on the server (404), which no resend gets past, and a failure after
    the answer was taken (a resend was then refused: "yours was not taken").
    """
    page = browser_page
    run_id = _api_run(server, _ask_script(tmp_path), "answers that go astray", {"auto_approve": True})
    page.goto(f"{server}/runs/{run_id}")
    answer = page.get_by_role("textbox", name="Which colour?")
    answer.fill("teal")
    unsent = page.locator("#run-unsent")

    def sent_as(route: Any, **how: Any) -> None:  # the answer reaches the server, altered on the way
        route.fulfill(response=route.fetch(**how))

    elsewhere = {"origin": "http://elsewhere.example"}  # as from a page on another site
    page.route("**/requests/*", lambda route: sent_as(route, headers={**route.request.headers, **elsewhere}))
    page.get_by_role("button", name="Answer").click()
    unsent.filter(has_text="Not sent: the server refused it").wait_for()
    assert unsent.inner_text() == (
        "Not sent: the server refused it (HTTP 403: a request from http://elsewhere.example cannot change "
        "anything here): sending it again from this page cannot help. Load the page again from the "
        "server's own address. What you typed and chose is still below, to copy."
    )
    page.unroute("**/requests/*")

    gone = "20260101-000000-abcdef"  # a run this server does not have (one deleted, another database)
    page.route("**/requests/*", lambda route: sent_as(route, url=route.request.url.replace(run_id, gone)))
    page.get_by_role("button", name="Answer").click()
    unsent.filter(has_text="Not sent: what it answers is no longer on the server").wait_for()
    assert unsent.inner_text() == (
        f"Not sent: what it answers is no longer on the server (HTTP 404: no run '{gone}'): sending it "
        "again cannot help. Load the page again to see the run as the server has it. What you typed "
        "and chose is still below, to copy."
    )
    page.unroute("**/requests/*")
    assert (answer.input_value(), _answered(server, "", run_id)) == ("teal", [])

    # taken, and the run then not read (the database lost): the server's 204 (test_web_pages pins it)
    taken = "Your answer was taken, but the page could not show the run as it is now (the database is lost)."
    trigger = {"HX-Trigger": json.dumps({"runActionTaken": taken})}
    page.route("**/requests/*", lambda route: (route.fetch(), route.fulfill(status=204, headers=trigger)))
    page.get_by_role("button", name="Answer").click()
    page.get_by_role("status").filter(has_text=taken).wait_for()
    assert unsent.is_hidden()
    page.locator("h1 .status-succeeded").wait_for(timeout=30_000)  # the body fetched again after it
    assert _answered(server, "", run_id) == ["ask_user"]


def test_an_answer_whose_reply_was_lost_sent_again_is_said_taken_already(
    server: str, browser_page: Any, tmp_path: Path
) -> None:
    """The server stored the answer but the page lost its reply: sent again, it is said taken.

    Before, the page said "not sent … send it again", and the answer sent again was refused:
    "… is already answered …; yours was not taken".
    """
    page = browser_page
    run_id = _api_run(server, _ask_script(tmp_path), "a reply lost", {"auto_approve": True})
    page.goto(f"{server}/runs/{run_id}")
    answer = page.get_by_role("textbox", name="Which colour?")
    answer.fill("teal")
    form_path = str(page.locator('form[hx-post*="/requests/"]').get_attribute("hx-post"))
    asked_at = "/requests/" + form_path.rsplit("/", 1)[1]
    unsent, taken = page.locator("#run-unsent"), page.locator("#run-taken")
    # the answer reaches the server, which stores it; its reply is lost on the way back
    page.route("**/requests/*", lambda route: (route.fetch(), route.abort("connectionreset")))
    page.get_by_role("button", name="Answer").click()
    unsent.filter(has_text="Not sent: the server could not be reached").wait_for()
    page.unroute("**/requests/*")
    assert _answered(server, "", run_id) == ["ask_user"]  # it was taken
    page.get_by_role("button", name="Answer").click()  # as the note says: sent again
    taken.filter(has_text="This answer was taken already").wait_for()
    with urllib.request.urlopen(f"{server}/api/v1{asked_at}", timeout=30) as got:
        asked = json.loads(got.read())
    said = (
        f"This answer was taken already (by {asked['answered_by']}, at {asked['answered_at']}): "
        "it is not stored twice."
    )
    assert taken.inner_text() == said
    assert unsent.is_hidden() and page.get_by_text("yours was not taken").count() == 0
    page.locator("h1 .status-succeeded").wait_for(timeout=30_000)
    assert _answered(server, "", run_id) == ["ask_user"]


def test_a_new_task_sent_after_the_login_ended_is_planned_once_logged_in_again(
    isolated: Path, browser_page: Any, tmp_path: Path
) -> None:
    """The form is answered with the login page, which sends it on as typed once the token is given.

    Before, the browser showed a 401 in JSON, and the task typed was gone.
    """
    page = browser_page
    with serving(isolated / "serve.log", "--auth") as server:
        token = (isolated / "web-token").read_text().strip()
        page.goto(f"{server}/new")
        page.get_by_label("Token").fill(token)
        page.get_by_role("button", name="Log in").click()
        task = 'Write a haiku about <tea> & "cakes"'
        page.get_by_label("Task").fill(task)
        page.get_by_label("Model", exact=True).fill(f"scripted:{_ask_script(tmp_path)}")
        page.context.clear_cookies()  # the login ended while the form was filled in
        page.get_by_role("button", name="Plan it").click()
        page.get_by_role("alert").filter(has_text="Not saved: your login to this server has ended").wait_for()
        assert page.get_by_role("heading", name="Log in").count() == 1
        page.get_by_label("Token").fill(token)
        page.get_by_role("button", name="Log in").click()
        page.get_by_role("heading", name="Review the plan").wait_for()
        run_id = page.url.split("/")[4]
        request = urllib.request.Request(
            f"{server}/api/v1/runs/{run_id}", headers={"Authorization": f"Bearer {token}"}
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            assert json.loads(response.read())["task"] == task
