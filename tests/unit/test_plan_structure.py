"""`plan_structure.clauses`: a task cut into its actions, deterministically, without a model."""

import pytest

from masterplanner.plan_structure import clauses

CASES = [
    # commas, "and", "then": each starts an action here
    (
        "Read notes.txt, summarize it and then write the summary to out.md",
        ["Read notes.txt", "summarize it", "write the summary to out.md"],
    ),
    (
        "Compute the total of data.csv, then write a sentence about it to report.md.",
        ["Compute the total of data.csv", "write a sentence about it to report.md"],
    ),
    (
        "Read a.txt; count its words; finally, save the count to count.txt",
        ["Read a.txt", "count its words", "save the count to count.txt"],
    ),
    (
        "Who directed Titanic? Give me his latest movie.",
        ["Who directed Titanic?", "Give me his latest movie"],
    ),
    (
        "1. Read data.csv\n2. Plot the sales\n3. Save the chart as chart.png",
        ["Read data.csv", "Plot the sales", "Save the chart as chart.png"],
    ),
    (
        "Please cancel my flight CA888 at 5 PM today, and book for me the MU123 flight at 8 AM tomorrow.",
        ["cancel my flight CA888 at 5 PM today", "book for me the MU123 flight at 8 AM tomorrow"],
    ),
    (
        "The total is 1,000.5 dollars; write it to total.txt",
        ["The total is 1,000.5 dollars", "write it to total.txt"],
    ),
    ("Compute the total, then the average", ["Compute the total", "the average"]),  # `then` always cuts
    # noun phrases: "x and y", lists, and verbs that are nouns here
    ("Write a poem about cats and dogs to poem.txt", ["Write a poem about cats and dogs to poem.txt"]),
    (
        "Write a list of apples, pears, and plums to fruits.txt",
        ["Write a list of apples, pears, and plums to fruits.txt"],
    ),
    ("Write a haiku and a limerick", ["Write a haiku and a limerick"]),
    ("Search for flights and hotels in Paris", ["Search for flights and hotels in Paris"]),
    ("Fetch the price and order history of AAPL", ["Fetch the price and order history of AAPL"]),
    ("Compute the sum and total", ["Compute the sum and total"]),
    ("Find the cheapest hotel and book it", ["Find the cheapest hotel", "book it"]),
    # no verb before the comma; a condition and its action
    (
        "For data.csv, compute the total of the amount column",
        ["For data.csv, compute the total of the amount column"],
    ),
    (
        "If the file exists, delete it. Then write a new one.",
        ["If the file exists, delete it", "write a new one"],
    ),
    ("If X exists, do Y, and then do Z", ["If X exists, do Y", "do Z"]),
    (
        "I have a file cn.txt, I want to change its content to 'Hello, World!', and then delete the file.",
        ["I have a file cn.txt, I want to change its content to 'Hello, World!'", "delete the file"],
    ),
    # quotes, brackets, file names, numbers, abbreviations
    (
        "Write 'Hello, world. And then some' to a.txt and read it back",
        ["Write 'Hello, world. And then some' to a.txt", "read it back"],
    ),
    ('Save "a, b and then c" to notes.md', ['Save "a, b and then c" to notes.md']),
    (
        "Order two dishes (soup and then rice, please) and pay",
        ["Order two dishes (soup and then rice, please)", "pay"],
    ),
    (
        "Find the director of Inception, e.g. Christopher Nolan, and list his other films",
        ["Find the director of Inception, e.g. Christopher Nolan", "list his other films"],
    ),
    ("Sum 1,000 and 2,500 from sales.v2.csv", ["Sum 1,000 and 2,500 from sales.v2.csv"]),
    (
        "Ask Dr. Smith about the results and email them to J. K. Rowling",
        ["Ask Dr. Smith about the results", "email them to J. K. Rowling"],
    ),
    # people asking
    (
        "I am at table 12, I need you to order two soups and one salad, "
        "then complete the order and help me pay.",
        [
            "I am at table 12, I need you to order two soups and one salad",
            "complete the order",
            "help me pay",
        ],
    ),
    ("Tell me the weather and I want to book a taxi", ["Tell me the weather", "I want to book a taxi"]),
    (
        "give me the number of movies directed by Sofia Coppola",
        ["give me the number of movies directed by Sofia Coppola"],
    ),
]


@pytest.mark.parametrize(("task", "expected"), CASES, ids=[task[:40] for task, _ in CASES])
def test_clauses(task: str, expected: list[str]) -> None:
    assert clauses(task) == expected


def test_no_text_no_clauses_and_any_text_at_least_one() -> None:
    assert clauses("") == []
    assert clauses(" \n ") == []
    assert clauses("and then") == ["and then"]
    assert clauses("...") == ["..."]


def test_clauses_are_deterministic() -> None:
    task = "Read a.csv, compute the mean and then write it to b.txt. " * 50
    first = clauses(task)
    assert first == clauses(task)
    assert len(first) == 150
