"""Every head of an atlas explained by a program, scored on held-out texts, saved beside the atlas.

``explain_heads(atlas)`` splits the atlas's texts (those of two tokens or more, at most
``MAX_TEXTS`` of them drawn with ``SEED``) into search texts and ``held_out`` texts, runs the
model once over both (``mhsa.explain.attention``), searches each head's program on the search
texts (``mhsa.explain.search``) and scores the chosen program and the runners-up on the
held-out texts only (``mhsa.explain.scores``): ``iou``, ``accuracy``, ``baseline`` (the best
fixed program, ``offset(d)`` for ``|d| <= 3``, ``first``, ``last`` or ``self``, by accuracy on
the texts scored, as Clark et al. 2019 pick their best offset) with ``baseline_accuracy``,
``auc`` and, where asked, ``faithfulness`` (``mhsa.explain.faithfulness``). The table is saved
in the atlas's folder (``explanations/``), which ``saved(atlas)`` reads back.

``score_program(atlas, head, program)`` scores one typed hypothesis on the same held-out texts
(or on ``texts=``): their attention is computed once per process and kept, so a hypothesis
costs its pattern and its scores alone.

``MAX_TEXTS`` bounds the cost whatever the atlas's size: the search's work grows with the
texts' (query, key) pairs, and the default keeps MiniLM's 72 heads over the default atlas within
the 2 minutes of CPU its target allows (without faithfulness).
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from mhsa.atlas.reader import Atlas
from mhsa.engine.models.loading import get_model
from mhsa.errors import InputError
from mhsa.explain.attention import TextAttention, attention_of, check_atlas
from mhsa.explain.faithfulness import (
    FAITHFULNESS_TEXTS,
    Faithfulness,
    heads_faithfulness,
    layer_faithfulness,
    many_heads_faithfulness,
    pattern_faithfulness,
)
from mhsa.explain.programs import Program, ProgramError, parse_program
from mhsa.explain.scores import accuracy, auc, soft_iou
from mhsa.explain.search import BASELINES, PairTable, search_heads
from mhsa.heads import parse_head_label

__all__ = [
    "COLUMNS",
    "MAX_TEXTS",
    "SEED",
    "HeadExplanations",
    "PatternExample",
    "explain_heads",
    "pattern_example",
    "saved",
    "score_program",
    "split_texts",
]

#: texts of the atlas an explanation reads at most (search and held-out together)
MAX_TEXTS = 240
#: the seed of the draw of those texts and of their split
SEED = 0
#: the explanation table's columns
COLUMNS = [
    "head",
    "program",
    "kind",
    "description",
    "iou",
    "accuracy",
    "baseline",
    "baseline_accuracy",
    "auc",
    "faithfulness",
    "faithfulness_note",
    "texts",
]
#: the folder in the atlas's folder that holds its explanations
FOLDER = "explanations"
FORMAT = 1


def split_texts(
    atlas: Atlas, held_out: float = 0.25, *, seed: int = SEED, max_texts: int = MAX_TEXTS
) -> tuple[list[int], list[int]]:
    """The atlas's search texts and held-out texts (text ids, ascending): of the texts with two
    tokens or more, ``max_texts`` drawn with ``seed``, of which a ``held_out`` share held out.

    Raises:
        InputError: ``held_out`` not strictly between 0 and 1, or fewer than 2 usable texts.
    """
    if isinstance(held_out, bool) or not isinstance(held_out, int | float) or not 0 < held_out < 1:
        raise InputError(f"held_out must be a share between 0 and 1, got {held_out!r}.")
    if isinstance(max_texts, bool) or not isinstance(max_texts, int) or max_texts < 2:
        raise InputError(f"max_texts must be a whole number of at least 2, got {max_texts!r}.")
    lengths = np.diff(np.asarray(atlas.offsets))
    usable = np.flatnonzero(lengths >= 2)
    if len(usable) < 2:
        raise InputError(
            "Explaining a head needs at least 2 texts of two tokens or more in the atlas "
            f"(it has {len(usable)}): build the atlas on more text."
        )
    drawn = np.random.default_rng(seed).permutation(usable)[:max_texts]
    n_held = min(len(drawn) - 1, max(1, round(held_out * len(drawn))))
    return sorted(int(t) for t in drawn[n_held:]), sorted(int(t) for t in drawn[:n_held])


def _no_tags_message(program: Program) -> str:
    return (
        f"The program {str(program)!r} reads part-of-speech tags (pos, when), and this atlas's "
        "corpus has none: build the atlas on a tagged corpus (the Brown Corpus), or use "
        "positional and token programs."
    )


def _check_program(atlas: Atlas, program: str | Program) -> Program:
    parsed = parse_program(program)
    if parsed.needs_tags and not atlas.has_tags:
        raise ProgramError(_no_tags_message(parsed))
    return parsed


def _check_texts(atlas: Atlas, texts: Sequence[int]) -> list[int]:
    if isinstance(texts, str | bytes) or not isinstance(texts, Sequence) or not texts:
        raise InputError(f"texts must be a list of the atlas's text ids, got {texts!r}.")
    lengths = np.diff(np.asarray(atlas.offsets))
    out = []
    for t in texts:
        if isinstance(t, bool) or not isinstance(t, int | np.integer) or not 0 <= t < len(lengths):
            raise InputError(
                f"texts must be text ids of the atlas, 0 to {len(lengths) - 1}, got {t!r}."
            )
        if lengths[int(t)] >= 2:
            out.append(int(t))
    if not out:
        raise InputError("None of the texts given has two tokens or more: nothing to score.")
    return out


# --- scoring on texts ---------------------------------------------------------------------------


def _scores(items: Sequence[TextAttention], i: int, program: Program) -> dict[str, float]:
    a = [it.weights[i] for it in items]
    p = [program.pattern(it.features) for it in items]
    norms = [it.norms[i] for it in items]
    causal = items[0].features.causal
    return {
        "iou": soft_iou(a, p),
        "accuracy": accuracy(a, p),
        "auc": auc(a, p, norms, causal=causal),
    }


#: ``score_program``'s baselines, per (atlas, build, head, texts): a bounded dict, oldest first out
_BASELINES: dict[tuple, tuple[str, float]] = {}
_BASELINES_LOCK = threading.Lock()


def _baseline(items: Sequence[TextAttention], i: int) -> tuple[str, float]:
    """The fixed program of highest accuracy on the texts (the first of ``BASELINES`` at a
    tie) and its accuracy."""
    a = [it.weights[i] for it in items]
    best, best_acc = "", -1.0
    for program in BASELINES:
        acc = accuracy(a, [program.pattern(it.features) for it in items])
        if acc > best_acc:
            best, best_acc = str(program), acc
    return best, best_acc


def _replacements(
    programs: dict[str, Program], items: Sequence[TextAttention]
) -> tuple[list[str], dict[tuple[int, int], list[np.ndarray]]]:
    """The first ``FAITHFULNESS_TEXTS`` texts and, per head, its program's pattern on each (a
    query the program gives no key writes nothing there: a miss, as in the scores)."""
    chosen = list(items[:FAITHFULNESS_TEXTS])
    patterns = {
        parse_head_label(head): [program.pattern(it.features) for it in chosen]
        for head, program in programs.items()
    }
    return [it.text_id for it in chosen], patterns


def _result(f: Faithfulness) -> tuple[float, str]:
    return float(f.value), ("" if np.isfinite(f.value) else str(f.reason))


def _held_out(atlas: Atlas) -> list[int]:
    """The held-out texts of the atlas's saved explanations (so that a typed hypothesis is
    scored beside them on the same texts), else of the default split."""
    meta = Path(atlas.folder) / FOLDER / "meta.json"
    try:
        settings = json.loads(meta.read_text())["settings"]
        if settings["atlas_built"] != atlas.manifest.get("built", ""):
            raise ValueError("made of an earlier build")
        return _check_texts(atlas, [int(t) for t in settings["held_out_texts"]])
    except (OSError, ValueError, KeyError, TypeError):
        return split_texts(atlas)[1]


def score_program(
    atlas: Atlas,
    head: str,
    program: str | Program,
    *,
    texts: Sequence[int] | None = None,
    faithfulness: bool = False,
) -> pd.Series:
    """One program's scores for one head of the atlas, on the held-out texts of its saved
    explanations (``explain_heads``; none saved: of the default split), or on the atlas's
    texts ``texts``.

    Returns:
        A Series with ``program``, ``iou``, ``accuracy``, ``baseline`` (the best fixed
        program's text), ``baseline_accuracy``, ``auc``, ``faithfulness`` (NaN unless asked,
        or where it has no meaning: ``faithfulness_note`` says why) and ``texts`` (how many
        were scored).

    Raises:
        ProgramError: the program does not parse, names an unknown tag, or reads tags the
            atlas does not have.
        InputError: a head the atlas lacks, or text ids it does not have.
    """
    check_atlas(atlas)
    parsed = _check_program(atlas, program)
    i = atlas.head(head)
    ids = _held_out(atlas) if texts is None else _check_texts(atlas, texts)
    items = attention_of(atlas, ids)
    values: dict[str, Any] = {"program": str(parsed), **_scores(items, i, parsed)}
    key = (str(atlas.folder), atlas.manifest.get("built", ""), i, tuple(ids))
    found = _BASELINES.get(key)
    if found is None:  # the same for every hypothesis typed for the head
        found = _baseline(items, i)
        with _BASELINES_LOCK:
            while len(_BASELINES) >= 4096:
                _BASELINES.pop(next(iter(_BASELINES)))
            _BASELINES[key] = found
    values["baseline"], values["baseline_accuracy"] = found
    values["faithfulness"], values["faithfulness_note"] = float("nan"), "not asked"
    if faithfulness:
        ids, patterns = _replacements({head: parsed}, items)
        texts = [atlas.text(t) for t in ids]
        values["faithfulness"], values["faithfulness_note"] = _result(
            pattern_faithfulness(get_model(atlas.model), texts, patterns)
        )
    values["texts"] = len(items)
    order = ["program", "iou", "accuracy", "baseline", "baseline_accuracy", "auc"]
    return pd.Series({k: values[k] for k in [*order, "faithfulness", "faithfulness_note", "texts"]})


@dataclass(frozen=True)
class PatternExample:
    """A head's attention and a program's pattern on one text of the atlas, to be drawn side
    by side.

    Attributes:
        text_id: the atlas's text.
        tokens: its tokens.
        attention: ``[n, n]``: the head's weights.
        pattern: ``[n, n]``: the program's (a row of zeros: the program gives that query no
            key).
    """

    text_id: int
    tokens: tuple[str, ...]
    attention: np.ndarray
    pattern: np.ndarray


def pattern_example(
    atlas: Atlas, head: str, program: str | Program, *, text_id: int | None = None
) -> PatternExample:
    """The head's attention and the program's pattern on the atlas's text ``text_id`` (None:
    the first held-out text ``score_program`` reads).

    Raises:
        ProgramError: as ``score_program``.
        InputError: a head the atlas lacks, a text it does not have or of one token.
    """
    check_atlas(atlas)
    parsed = _check_program(atlas, program)
    i = atlas.head(head)
    chosen = _held_out(atlas)[0] if text_id is None else _check_texts(atlas, [text_id])[0]
    item = attention_of(atlas, [chosen])[0]
    return PatternExample(
        chosen, item.features.tokens, item.weights[i].copy(), parsed.pattern(item.features)
    )


# --- every head ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class HeadExplanations:
    """The explanation of each head of an atlas (``explain_heads``).

    Attributes:
        table: one row per head (``COLUMNS``).
        candidate_table: per head its ``top`` programs, best first (``rank`` 0 is the
            chosen one), each with its held-out ``iou``, ``accuracy`` and ``auc`` and its
            ``search_iou``.
        notices: what the reader should know (no tags: no linguistic programs).
        settings: model, seed, held-out share, the texts searched and held out, CPU seconds.
        together: with faithfulness, the heads replaced at once by their programs: one row
            per layer whose every head was explained (``what`` ``"L3"``) and one for the
            best-explained quarter of the model's heads by held-out IoU (``"best quarter"``),
            with ``faithfulness``, ``note`` (why there is no number) and ``heads``.
    """

    table: pd.DataFrame
    candidate_table: pd.DataFrame
    notices: tuple[str, ...] = ()
    settings: dict[str, Any] = field(default_factory=dict)
    together: pd.DataFrame = field(
        default_factory=lambda: pd.DataFrame(columns=["what", "faithfulness", "note", "heads"])
    )

    def candidates(self, head: str) -> pd.DataFrame:
        """The head's top programs with their scores, best first.

        Raises:
            InputError: no explanation of that head here.
        """
        rows = self.candidate_table[self.candidate_table["head"] == head]
        if rows.empty:
            heads = ", ".join(self.table["head"].head(4)) + (" ..." if len(self.table) > 4 else "")
            raise InputError(f"No explanation of head {head!r} here; the heads are {heads}.")
        return rows.drop(columns="head").reset_index(drop=True)

    def save(self, folder: str | Path) -> Path:
        """Written into ``folder/explanations/`` (it appears whole or not at all); returns it."""
        target = Path(folder) / FOLDER
        tmp = Path(folder) / f".{FOLDER}.{os.getpid()}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        self.table.to_csv(tmp / "table.csv", index=False)
        self.candidate_table.to_csv(tmp / "candidates.csv", index=False)
        self.together.to_csv(tmp / "together.csv", index=False)
        meta = {"kind": "mhsa-explanations", "format": FORMAT, "notices": list(self.notices)}
        (tmp / "meta.json").write_text(json.dumps({**meta, "settings": self.settings}, indent=1))
        old = Path(folder) / f".{FOLDER}.{os.getpid()}.old"
        if target.exists():
            os.replace(target, old)
        os.replace(tmp, target)
        shutil.rmtree(old, ignore_errors=True)
        return target

    @classmethod
    def load(cls, folder: str | Path) -> HeadExplanations:
        """Read back from ``folder/explanations/`` (``save``).

        Raises:
            InputError: no explanations there, or unreadable ones.
        """
        where = Path(folder) / FOLDER
        text = ("head", "program", "kind", "description", "baseline", "what", "heads")
        text += ("faithfulness_note", "note")
        try:
            meta = json.loads((where / "meta.json").read_text())
            if meta.get("kind") != "mhsa-explanations" or int(meta["format"]) > FORMAT:
                raise ValueError("not explanations this version reads")
            frames = []
            for name in ("table", "candidates", "together"):
                frame = pd.read_csv(where / f"{name}.csv", dtype=str, keep_default_na=False)
                for c in frame.columns:
                    if c not in text:
                        frame[c] = pd.to_numeric(frame[c].replace("", np.nan))
                frames.append(frame)
        except (OSError, ValueError, KeyError) as e:
            raise InputError(f"No readable explanations in {str(where)!r} ({e}).") from e
        table, candidates, together = frames
        return cls(
            table, candidates, tuple(meta.get("notices", ())), meta.get("settings", {}), together
        )


def saved(atlas: Atlas) -> HeadExplanations | None:
    """The explanations saved in the atlas's folder, or None where there are none (or they
    were made of an earlier build of the atlas in the same folder)."""
    if not (Path(atlas.folder) / FOLDER / "meta.json").is_file():
        return None
    found = HeadExplanations.load(atlas.folder)
    if found.settings.get("atlas_built", "") != atlas.manifest.get("built", ""):
        return None
    return found


def _heads(atlas: Atlas, heads: Sequence[str] | str | None) -> list[str]:
    if heads is None:
        return list(atlas.labels)
    chosen = [heads] if isinstance(heads, str) else list(heads)
    if not chosen:
        raise InputError("heads must name at least one head of the atlas (or be None: all).")
    for h in chosen:
        atlas.head(h)
    return list(dict.fromkeys(chosen))


def _together(
    atlas: Atlas, programs: dict[str, Program], iou: dict[str, float], held: list[TextAttention]
) -> tuple[dict[str, tuple[float, str]], pd.DataFrame]:
    """Each head's faithfulness alone, and the heads replaced together: each layer whose every
    head of the atlas is explained, and the best-explained quarter of the model's heads."""
    lm = get_model(atlas.model)
    ids, patterns = _replacements(programs, held)
    texts = [atlas.text(t) for t in ids]
    alone = heads_faithfulness(lm, texts, patterns)
    each = {head: _result(alone[parse_head_label(head)]) for head in programs}
    rows = []
    layers = {parse_head_label(h)[0] for h in atlas.labels}
    whole = {
        layer: {h: p for h, p in patterns.items() if h[0] == layer}
        for layer in sorted(layers)
        if all(
            parse_head_label(h) in patterns for h in atlas.labels if parse_head_label(h)[0] == layer
        )
    }
    if whole:
        merged = {h: p for part in whole.values() for h, p in part.items()}
        for layer, f in layer_faithfulness(lm, texts, merged).items():
            rows.append((f"L{layer}", *_result(f), ",".join(f.labels)))
    try:
        f = many_heads_faithfulness(lm, texts, patterns, iou)
        rows.append(("best quarter", *_result(f), ",".join(f.labels)))
    except InputError as e:  # fewer heads explained than a quarter of the model's
        rows.append(("best quarter", float("nan"), str(e), ""))
    return each, pd.DataFrame(rows, columns=["what", "faithfulness", "note", "heads"])


def explain_heads(
    atlas: Atlas,
    *,
    heads: Sequence[str] | str | None = None,
    held_out: float = 0.25,
    top: int = 3,
    faithfulness: bool = True,
    progress: bool = True,
    seed: int = SEED,
    max_texts: int = MAX_TEXTS,
    save: bool | None = None,
) -> HeadExplanations:
    """Every head (or ``heads``) of the atlas explained by the program that best reproduces
    its attention on the search texts, scored on the held-out texts (see the module docstring).

    Args:
        atlas: an atlas of an encoder's or a decoder's self-attention (``mhsa.atlas``).
        heads: head labels (``"L3H4"``); None: every head of the atlas.
        held_out: the share of the texts kept out of the search and scored.
        top: the programs kept per head (``HeadExplanations.candidates``).
        faithfulness: also each chosen program's faithfulness (forward passes with the
            head's pattern replaced, ``mhsa.explain.faithfulness``, on the first
            ``FAITHFULNESS_TEXTS`` held-out texts), each layer's and the best quarter's.
        progress: a bar on stderr.
        seed: the draw of the texts and their split.
        max_texts: the texts read at most.
        save: write the result into the atlas's folder (``explanations/``); None: when every
            head is explained.

    Raises:
        InputError: a head the atlas lacks, a bad ``held_out`` or ``top``, too few texts;
            nothing is written then.
    """
    check_atlas(atlas)
    labels = _heads(atlas, heads)
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise InputError(f"top must be a whole number of at least 1, got {top!r}.")
    search_ids, held_ids = split_texts(atlas, held_out, seed=seed, max_texts=max_texts)
    start = time.process_time()
    notices = []
    if not atlas.has_tags:
        notices.append(
            "This atlas's corpus has no part-of-speech tags: no linguistic programs (pos, when) "
            "were tried."
        )
    items = attention_of(atlas, search_ids + held_ids)
    by_id = {it.text_id: it for it in items}
    search = [by_id[t] for t in search_ids if t in by_id]
    held = [by_id[t] for t in held_ids if t in by_id]
    index = [atlas.head(h) for h in labels]
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(labels), desc="explain", unit="head")
    table = PairTable(search, list(range(len(atlas.labels))))
    found = search_heads(table, index, top=top, progress=bar.update if bar else None)
    if bar is not None:
        bar.close()
    rows, candidates = [], []
    for label, i, result in zip(labels, index, found, strict=True):
        baseline, baseline_acc = _baseline(held, i)
        for rank, (program, search_iou) in enumerate(zip(result.programs, result.iou, strict=True)):
            scores = _scores(held, i, program)
            described = {"program": str(program), "kind": program.kind}
            described["description"] = program.describe()
            candidates.append(
                {"head": label, "rank": rank, **described, **scores, "search_iou": search_iou}
            )
            if rank == 0:
                rows.append(
                    {
                        "head": label,
                        **described,
                        "iou": scores["iou"],
                        "accuracy": scores["accuracy"],
                        "baseline": baseline,
                        "baseline_accuracy": baseline_acc,
                        "auc": scores["auc"],
                        "faithfulness": float("nan"),
                        "faithfulness_note": "not asked",
                        "texts": len(held),
                    }
                )
    frame = pd.DataFrame(rows, columns=COLUMNS)
    together = HeadExplanations.__dataclass_fields__["together"].default_factory()
    if faithfulness:
        programs = {label: r.programs[0] for label, r in zip(labels, found, strict=True)}
        iou = dict(zip(frame["head"], frame["iou"], strict=True))
        each, together = _together(atlas, programs, iou, held)
        frame["faithfulness"] = [each[h][0] for h in frame["head"]]
        frame["faithfulness_note"] = [each[h][1] for h in frame["head"]]
    settings = {
        "model": atlas.model,
        "atlas_built": atlas.manifest.get("built", ""),
        "seed": seed,
        "held_out": held_out,
        "max_texts": max_texts,
        "search_texts": search_ids,
        "held_out_texts": held_ids,
        "faithfulness_texts": held_ids[:FAITHFULNESS_TEXTS] if faithfulness else [],
        "cpu_seconds": round(time.process_time() - start, 3),
    }
    out = HeadExplanations(frame, pd.DataFrame(candidates), tuple(notices), settings, together)
    if save or (save is None and heads is None):
        out.save(atlas.folder)
    return out
