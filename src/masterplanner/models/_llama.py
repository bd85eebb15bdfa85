"""llama.cpp in-process: load a GGUF once per process and run generations one at a time.

A `llama_cpp.Llama` is not safe to use from two threads at once, so each loaded model owns one
worker thread and every generation for it runs there, in arrival order. The asyncio side awaits
that thread without blocking the event loop; a cancelled caller stops its generation at the
next token.
"""

from __future__ import annotations

import asyncio
import atexit
import ctypes
import json
import logging
import os
import re
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from ..errors import ModelError, ModelFileError
from ..gguf import check_gguf, embedded_model_path

__all__ = ["Generation", "LlamaRuntime", "check_gguf", "embedded_model_path", "load_llama"]

_LOOSE_JSON_CHAR = 'char ::= [^"\\\\] |'
_STRICT_JSON_CHAR = 'char ::= [^"\\\\\\x7F\\x00-\\x1F] |'


@dataclass(frozen=True)
class Generation:
    """What one generation produced."""

    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int


class LlamaRuntime:
    """One loaded GGUF model and the single thread that runs it."""

    def __init__(self, llama: Any, path: Path) -> None:
        self.path = path
        self._llama = llama
        self._formatter = _chat_formatter(llama, path)
        self._grammars: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"llama-{path.stem}")

    @property
    def context_tokens(self) -> int:
        """The context window this model was loaded with."""
        return int(self._llama.n_ctx())

    def generate_sync(
        self,
        messages: list[dict[str, str]],
        *,
        schema: dict[str, Any] | None,
        max_tokens: int,
        temperature: float = 0.0,
        top_p: float = 1.0,
        repeat_penalty: float = 1.1,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        seed: int | None = None,
        stop: list[str] | None = None,
        cancelled: threading.Event | None = None,
    ) -> Generation:
        """Generate a chat completion; with `schema`, the output is constrained to match it."""
        from llama_cpp import StoppingCriteriaList

        flag = cancelled or threading.Event()
        if flag.is_set():
            raise ModelError("generation cancelled before it started")
        grammar = self._grammar(schema) if schema is not None else None
        # The chat template is applied here rather than through create_chat_completion, which
        # cannot take stopping criteria: those are how a cancelled caller stops the generation.
        formatted = self._formatter(messages=messages)
        template_stop = formatted.stop if isinstance(formatted.stop, list) else [formatted.stop]
        criteria = StoppingCriteriaList([lambda _ids, _logits: flag.is_set()])
        if formatted.stopping_criteria is not None:
            criteria.extend(formatted.stopping_criteria)
        with self._lock:
            prompt = self._llama.tokenize(
                formatted.prompt.encode("utf-8"), add_bos=not formatted.added_special, special=True
            )
            try:
                result = self._llama.create_completion(
                    prompt=prompt,
                    grammar=grammar,
                    max_tokens=max_tokens,
                    temperature=temperature,
                    top_p=top_p,
                    repeat_penalty=repeat_penalty,
                    presence_penalty=presence_penalty,
                    frequency_penalty=frequency_penalty,
                    seed=seed,
                    stop=[*(stop or []), *(item for item in template_stop if item)],
                    stopping_criteria=criteria,
                )
            except ValueError as exc:  # llama-cpp-python reports context overflow this way
                raise ModelError(f"local model {self.path.name}: {_in_our_words(exc)}") from exc
        if flag.is_set():
            raise ModelError("generation cancelled")
        choice = result["choices"][0]
        usage = result.get("usage") or {}
        return Generation(
            text=choice.get("text") or "",
            finish_reason=choice.get("finish_reason") or "stop",
            prompt_tokens=int(usage.get("prompt_tokens", len(prompt))),
            completion_tokens=int(usage.get("completion_tokens", 0)),
        )

    def _grammar(self, schema: dict[str, Any]) -> Any:
        """The compiled grammar for `schema`, checked by llama.cpp itself (cached, most recent 64)."""
        from llama_cpp import llama_cpp
        from llama_cpp.llama_grammar import LlamaGrammar, json_schema_to_gbnf

        key = json.dumps(schema)  # key order kept: it is the order the model writes properties in
        grammar = self._grammars.get(key)
        if grammar is None:
            try:
                text = json_schema_to_gbnf(key)
            except (ValueError, KeyError, NotImplementedError, RuntimeError) as exc:
                raise ModelError(f"cannot turn the JSON schema into a grammar: {exc}") from None
            # This converter lets strings hold raw control characters (a newline, say), which JSON
            # forbids: the embedded model wrote them and its replies failed to parse.
            grammar = LlamaGrammar.from_string(
                text.replace(_LOOSE_JSON_CHAR, _STRICT_JSON_CHAR), verbose=False
            )
            # llama.cpp refuses some grammars (too large, unsupported repetition); a refused grammar
            # handed to the sampler crashes the process, so try it here first.
            probe = llama_cpp.llama_sampler_init_grammar(
                self._llama._model.vocab, grammar._grammar.encode(), grammar._root.encode()
            )
            if not probe:
                raise ModelError(
                    "llama.cpp refused the grammar built from the JSON schema (too large or complex)"
                )
            llama_cpp.llama_sampler_free(probe)
            self._grammars[key] = grammar
            if len(self._grammars) > 64:
                self._grammars.popitem(last=False)
        else:
            self._grammars.move_to_end(key)
        return grammar

    def close(self) -> None:
        """Free the model's memory; the runtime cannot generate afterwards."""
        self._executor.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            self._llama.close()

    async def generate(self, messages: list[dict[str, str]], **options: Any) -> Generation:
        """`generate_sync` on this model's thread; cancelling the caller stops the generation."""
        cancelled = threading.Event()
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(
            self._executor, partial(self.generate_sync, messages, cancelled=cancelled, **options)
        )
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            cancelled.set()
            # nobody awaits the stopped generation now: its "generation cancelled" is expected, and
            # unretrieved it was printed with a traceback as the loop closed (Ctrl-C of `run`)
            future.add_done_callback(_retrieved)
            raise


def _retrieved(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def _in_our_words(error: ValueError) -> str:
    """llama-cpp-python's complaint, in our words when it is the context window's."""
    found = re.match(r"Requested tokens \((\d+)\) exceed context window of (\d+)", str(error))
    if found is None:
        return str(error)
    asked, window = int(found.group(1)), int(found.group(2))
    return (
        f"the request is {asked:,} tokens, more than its context window of {window:,} "
        "(setting local_context_tokens): give it a shorter task or inputs, or a model with a larger window"
    )


_loaded: dict[tuple[str, int, int], LlamaRuntime] = {}
_loading = threading.Lock()


@atexit.register
def _close_all() -> None:
    # Free llama.cpp models before interpreter shutdown tears down the bindings they need.
    with _loading:
        while _loaded:
            _loaded.popitem()[1].close()


def load_llama(path: Path | None, *, context_tokens: int, threads: int | None) -> LlamaRuntime:
    """The process-wide runtime for `path` (default: the embedded model), loading it on first use."""
    path = check_gguf((path or embedded_model_path()).resolve())
    thread_count = threads or os.cpu_count() or 1
    key = (str(path), context_tokens, thread_count)
    with _loading:
        runtime = _loaded.get(key)
        if runtime is None:
            runtime = LlamaRuntime(_open(path, context_tokens, thread_count), path)
            _loaded[key] = runtime
        return runtime


def _chat_formatter(llama: Any, path: Path) -> Any:
    """The model's own chat template (from its GGUF metadata), as llama-cpp-python builds it."""
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    template = llama.metadata.get("tokenizer.chat_template")
    if not template:
        raise ModelFileError(str(path), "has no chat template (tokenizer.chat_template) in its metadata")
    eos_id, bos_id = llama.token_eos(), llama.token_bos()
    return Jinja2ChatFormatter(
        template=template,
        eos_token=llama._model.token_get_text(eos_id) if eos_id != -1 else "",
        bos_token=llama._model.token_get_text(bos_id) if bos_id != -1 else "",
        stop_token_ids=[eos_id],
    )


class _Unredirected:
    """What llama-cpp-python's `suppress_stdout_stderr` is replaced with: it redirects nothing."""

    def __init__(self, disable: bool = True) -> None:
        del disable

    def __enter__(self) -> _Unredirected:
        return self

    def __exit__(self, *_exc: object) -> None:
        return None


_LLAMA_LOG = logging.getLogger("masterplanner.llama")
_log_callback: Any = None
"""llama.cpp's log callback while set (kept referenced: llama.cpp holds only its address)."""
_quieting = threading.Lock()


def quiet_llama_cpp() -> None:
    """Send llama.cpp's log lines to logging, and load models leaving stdout and stderr alone.

    Called before any model is loaded (once is enough); the lines go to the
    `masterplanner.llama` logger at debug level. llama-cpp-python loads a model
    (`verbose=False`) inside `suppress_stdout_stderr`, which points file descriptors 1 and 2 at
    /dev/null for the whole process while it loads (0.4 s for the embedded model): every other
    thread's and task's output went with it. A run's first progress line in the CLI ("finding
    similar teams", printed as the embedder loaded) was lost so, and a server's log lines would
    have been. llama.cpp's own lines go through its log callback, which printed them to stderr;
    here they go to logging, and the redirection does nothing.
    """
    global _log_callback
    with _quieting:
        if _log_callback is not None:
            return
        import llama_cpp
        import llama_cpp._internals
        import llama_cpp.llama
        import llama_cpp.llama_chat_format

        @llama_cpp.llama_log_callback  # type: ignore[untyped-decorator]
        def to_logging(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
            del level, user_data
            _LLAMA_LOG.debug("%s", text.decode("utf-8", errors="replace").rstrip("\n"))

        llama_cpp.llama_log_set(to_logging, ctypes.c_void_p(0))
        for module in (llama_cpp.llama, llama_cpp._internals, llama_cpp.llama_chat_format):
            module.suppress_stdout_stderr = _Unredirected
        _log_callback = to_logging


def _open(path: Path, context_tokens: int, threads: int) -> Any:
    from ._sampling import FastGrammarLlama

    quiet_llama_cpp()
    try:
        return FastGrammarLlama(
            model_path=str(path),
            n_ctx=context_tokens,
            n_threads=threads,
            n_threads_batch=threads,
            verbose=False,
        )
    except (ValueError, RuntimeError) as exc:
        raise ModelFileError(str(path), f"llama.cpp cannot load it: {exc}") from None
