"""The one-token-first grammar check must pick exactly what the full check picks."""

import json

import pytest
from llama_cpp import Llama
from llama_cpp.llama_grammar import LlamaGrammar

from masterplanner.models._sampling import FastGrammarLlama
from masterplanner.models.local import embedded_model_path

pytestmark = pytest.mark.local_model

SCHEMAS = [
    {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "population": {"type": "integer", "minimum": 0},
            "climate": {"enum": ["dry", "humid", "cold"]},
            "districts": {"type": "array", "items": {"type": "string"}, "maxItems": 4},
        },
        "required": ["city", "population", "climate", "districts"],
    },
    {
        "anyOf": [
            {
                "type": "object",
                "properties": {
                    "tool": {"const": "add"},
                    "arguments": {
                        "type": "object",
                        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                        "required": ["a", "b"],
                    },
                },
                "required": ["tool", "arguments"],
            },
            {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]},
        ]
    },
]
PROMPTS = ["Describe Lisbon as JSON.", "What is 17 plus 25? Reply as JSON."]


@pytest.mark.parametrize(("schema", "prompt"), list(zip(SCHEMAS, PROMPTS, strict=True)))
def test_same_tokens_as_the_full_grammar_check(schema: dict[str, object], prompt: str) -> None:
    grammar = LlamaGrammar.from_json_schema(json.dumps(schema), verbose=False)
    text = f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"
    outputs = []
    for cls in (Llama, FastGrammarLlama):
        llama = cls(model_path=str(embedded_model_path()), n_ctx=1024, n_threads=2, verbose=False)
        result = llama.create_completion(
            prompt=text, grammar=grammar, max_tokens=200, temperature=0.0, repeat_penalty=1.1
        )
        outputs.append((result["choices"][0]["text"], result["usage"]["completion_tokens"]))
        llama.close()
    assert outputs[0] == outputs[1]
    json.loads(outputs[1][0])


def test_grammar_strings_exclude_raw_control_characters() -> None:
    from masterplanner.models.local import load_llama

    runtime = load_llama(None, context_tokens=2048, threads=None)
    grammar = runtime._grammar(
        {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
    )
    assert 'char ::= [^"\\\\\\x7F\\x00-\\x1F] |' in grammar._grammar
    generation = runtime.generate_sync(
        [{"role": "user", "content": "Write a poem of four lines as JSON."}],
        schema={"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
        max_tokens=300,
    )
    json.loads(generation.text)


def test_a_grammar_llama_cpp_refuses_is_an_error_not_a_crash() -> None:
    from masterplanner import ModelError
    from masterplanner.models.local import load_llama

    runtime = load_llama(None, context_tokens=2048, threads=None)
    too_long = {
        "type": "object",
        "properties": {"text": {"type": "string", "maxLength": 5000}},
        "required": ["text"],
    }
    with pytest.raises(ModelError, match=r"llama\.cpp refused the grammar"):
        runtime._grammar(too_long)
