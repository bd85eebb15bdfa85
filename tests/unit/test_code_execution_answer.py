"""`code_execution`'s answer to the agent, and what the engine reads back from it."""

from masterplanner.sandbox import SandboxResult
from masterplanner.tools.code_execution import format_result, succeeded_output


def _result(stdout: str, exit_code: int = 0, *, stderr: str = "", cut: bool = False) -> SandboxResult:
    return SandboxResult(stdout, stderr, exit_code, False, cut, False, 0.1)


def test_the_output_of_a_program_that_succeeded_is_read_back_from_its_answer() -> None:
    assert succeeded_output(format_result(_result("COUNT(*)\n4\n", stderr="note"))) == "COUNT(*)\n4"
    assert succeeded_output(format_result(_result(""))) == ""
    # a failure, a kill or output cut short is not an output to work from
    assert succeeded_output(format_result(_result("partial\n", 1))) is None
    assert succeeded_output(format_result(_result("1\n2\n", cut=True))) is None
    killed = SandboxResult("1\n", "", -9, True, False, False, 30.0, killed="the program ran longer than 30 s")
    assert succeeded_output(format_result(killed)) is None
