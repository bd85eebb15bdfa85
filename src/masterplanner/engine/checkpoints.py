"""Checkpointed model requests: each request of a step agent is a DBOS step."""

from __future__ import annotations

from dbos import DBOS
from pydantic_ai.messages import ModelMessage, ModelResponse
from pydantic_ai.models import Model, ModelRequestParameters
from pydantic_ai.models.wrapper import WrapperModel
from pydantic_ai.settings import ModelSettings

from ..models import LabelledModel
from ..usage import UsageLedger

__all__ = ["CheckpointedModel", "checkpointed_and_counted"]


class CheckpointedModel(WrapperModel):
    """Makes each model request a DBOS step: its response is recorded, and replayed on recovery.

    pydantic-ai's `DBOSDurability` does the same for an agent's model, but it registers DBOS step
    functions under the agent's name when the agent is built, and step agents are built per step
    at run time (their model carries the step's purpose label and tool aids): every build would
    register again. Function tools it runs inline either way; ours are checkpointed by `run_tool`.
    """

    async def request(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
    ) -> ModelResponse:
        """Make the request as a DBOS step (inside a workflow its recorded response is replayed)."""
        return await DBOS.run_step_async(
            {"name": "model_request"},
            self.wrapped.request,
            messages,
            model_settings,
            model_request_parameters,
        )


def checkpointed_and_counted(model: Model, ledger: UsageLedger) -> Model:
    """`model` for code that labels it itself (the planner, the Prompt Creator) inside a workflow.

    Each request is a DBOS step, and is counted in `ledger` under the purpose the caller's label
    sets only when it is really made: a request replayed on recovery is not counted again. Give
    the caller a ledger of its own (or none), so its labelling does not count the request too.
    """
    return CheckpointedModel(LabelledModel(model, None, ledger))
