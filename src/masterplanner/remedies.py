"""What a person can do about a refusal or a wait, named apart from the front end that says it.

The service and the stores say why (no process executes the run, an id names nothing) in words
any front end can show, and name what to do as data: a `Remedy`. Each front end says the remedy
in its own terms: the CLI the command to type, the web page the button it shows, the REST API
the endpoint to call (`Remedy.said`). Before, every front end said the CLI's command: a run's web
page said "continue it with `masterplanner runs resume RUN`" above its own Resume button.

A remedy only a terminal gives (starting a worker) is no `Remedy`: its words name the command
wherever they are shown.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["FrontEnd", "Remedy", "RemedyAction", "Said"]

FrontEnd = Literal["cli", "web", "api"]
"""Who says it: the terminal, a run's web page (and its own requests), a program over the API."""

RemedyAction = Literal[
    "list_runs",
    "open_requests",
    "resume",
    "resume_or_cancel",
    "cancel_again",
    "answer_remember",
    "show_team",
    "retry_later",
    "retry_again",
]
"""`list_runs`: see the runs (an id named none); `open_requests`: see the requests open (an id
named none); `resume`: resume the run (no process executes it); `resume_or_cancel`: a process
taking the run (a worker, a resume, a cancel asked again) ends it as cancelled; `cancel_again`:
the same for a run queued for workers, which a server does not resume (only a worker or a
terminal's `runs resume` takes it); `answer_remember`: answer the run's question whether to
store its team; `show_team`: see the team stored from the run (its id is the run's);
`retry_later`: retry the failed run once the live process ending it lets go; `retry_again`:
retry the failed run again, which finishes first the end its stopped process left undone."""

_API = "/api/v1"


@dataclass(frozen=True)
class Remedy:
    """What to do, as data: the action and what it is done to (a run, a request)."""

    action: RemedyAction
    run_id: str = ""
    request_id: str = ""

    def said(self, front_end: FrontEnd = "cli", *, resumes: bool = True) -> str:
        """The remedy in `front_end`'s terms, as the words that follow a reason.

        Its leading punctuation included: `: continue it with …`, ` (see …)`. `resumes`: whether
        the front end resumes runs; a server that executes none (`serve --workers`) names the
        terminal's command for a resume, where its own button or endpoint would be refused.
        """
        run, request = self.run_id, self.request_id
        resume = _run_action(front_end if resumes else "cli", run, "resume", "Resume run")
        cancel = _run_action(front_end, run, "cancel", "Cancel run")
        if self.action == "list_runs":
            return {
                "cli": " (see `masterplanner runs list`)",
                "web": " (see the list of runs)",
                "api": f" (see GET {_API}/runs)",
            }[front_end]
        if self.action == "open_requests":
            return {
                "cli": " (see `masterplanner runs pending`)",
                "web": " (the run's page shows its open requests)",
                "api": f" (see GET {_API}/requests)",
            }[front_end]
        if self.action == "resume":
            return f": continue it with {resume}"
        if self.action == "resume_or_cancel":
            return f" (a worker, {resume}, or {cancel} again)"
        if self.action == "cancel_again":
            return (
                f" (a worker, or {cancel} again)"
                if front_end != "cli"
                else f" (a worker, {resume}, or {cancel} again)"
            )
        if self.action in ("retry_later", "retry_again"):
            retry = _run_action(front_end, run, "retry", "Retry from where it failed")
            if self.action == "retry_later":
                return f": retry it once that process lets go, with {retry}"
            return f": retry it again with {retry}, which finishes that end first"
        if self.action == "answer_remember":
            return {
                "cli": f" (`masterplanner runs answer {request} --approve`)",
                "web": " (on the run's page)",
                "api": f' (POST {_API}/requests/{request}/answer with {{"approve": true}})',
            }[front_end]
        return {  # show_team
            "cli": f" (`masterplanner cohorts show {run}`)",
            "web": " (see it under Teams)",
            "api": f" (GET {_API}/teams/{run})",
        }[front_end]


@dataclass(frozen=True)
class Said:
    """A reason with what to do about it, if anything: words each front end finishes in its terms."""

    reason: str
    remedy: Remedy | None = None

    def said(self, front_end: FrontEnd = "cli", *, resumes: bool = True) -> str:
        """The reason, then the remedy in `front_end`'s terms (`Remedy.said`)."""
        return self.reason + (self.remedy.said(front_end, resumes=resumes) if self.remedy is not None else "")

    def __str__(self) -> str:
        return self.said()


def _run_action(front_end: FrontEnd, run: str, verb: str, button: str) -> str:
    """How `front_end` does `verb` to the run: the CLI's command, the page's button, the API's endpoint."""
    return {
        "cli": f"`masterplanner runs {verb} {run}`",
        "web": f"its {button} button",
        "api": f"POST {_API}/runs/{run}/{verb}",
    }[front_end]
