"""The circuit graph (EAP-IG's ``Graph.from_model``, hannamw/EAP-IG ``src/eap/graph.py``): its
nodes, its edges and their order, and edges named by people (``mhsa.circuits`` scores them).

Nodes: ``input`` (the residual entering layer 0), each head ``L{l}H{h}``, each MLP ``M{l}``
and ``logits``. An edge runs from every node into every node downstream of it: into a head's
query, key or value input (TransformerLens's split q/k/v input), an MLP's input or the logits'.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache, cached_property
from typing import Any

import numpy as np
import pandas as pd

from mhsa.engine.result import html_view
from mhsa.errors import InputError
from mhsa.heads import head_label

__all__ = ["INPUT", "LOGITS", "QKV", "CircuitGraph", "graph_of", "mlp_label"]

#: the inputs of a head, in the graph's order
QKV = ("q", "k", "v")
INPUT, LOGITS = "input", "logits"


def mlp_label(layer: int) -> str:
    """An MLP node's name, ``M{layer}``."""
    return f"M{layer}"


@dataclass(frozen=True)
class CircuitGraph:
    """The edges of a model of ``layers`` layers of ``heads`` heads (EAP-IG's
    ``Graph.from_model``). ``parallel``: attention and MLP read the same residual (GPT-J,
    GPT-NeoX with ``use_parallel_residual``, Phi, Falcon; EAP-IG's ``parallel_attn_mlp``), so a
    head does not feed its own layer's MLP, only those above.

    Sources are in the forward order ``input, L0H0 .. L0H{H-1}, M0, L1H0, ...``; targets are,
    per layer, every head's q, then every k, then every v, then the MLP, and last ``logits``.
    A target reads the first ``upstream[t]`` sources.
    """

    layers: int
    heads: int
    parallel: bool = False

    @cached_property
    def sources(self) -> tuple[str, ...]:
        names = [INPUT]
        for layer in range(self.layers):
            names += [head_label(layer, h) for h in range(self.heads)] + [mlp_label(layer)]
        return tuple(names)

    @cached_property
    def targets(self) -> tuple[tuple[str, str], ...]:
        """``(node, input)``: input "q", "k", "v" for a head, "" otherwise."""
        out: list[tuple[str, str]] = []
        for layer in range(self.layers):
            out += [(head_label(layer, h), x) for x in QKV for h in range(self.heads)]
            out.append((mlp_label(layer), ""))
        return (*out, (LOGITS, ""))

    @cached_property
    def upstream(self) -> tuple[int, ...]:
        out: list[int] = []
        for layer in range(self.layers):
            first = 1 + layer * (self.heads + 1)  # input and the layers below
            out += [first] * (3 * self.heads)
            out.append(first if self.parallel else first + self.heads)
        return (*out, len(self.sources))

    @cached_property
    def mask(self) -> np.ndarray:
        """``[sources, targets]``: True where the edge exists."""
        rows = np.arange(len(self.sources))[:, None]
        return rows < np.asarray(self.upstream)[None, :]

    @property
    def n_edges(self) -> int:
        return int(self.mask.sum())

    def _repr_html_(self) -> str:
        """In a notebook: the graph's size, and its edges drawn when few
        (``mhsa.plots.notebook_results.graph_html``)."""
        return html_view("circuit graph")(self)

    @cached_property
    def edge_index(self) -> tuple[np.ndarray, np.ndarray]:
        """``(source, target)`` indices of every edge, ordered by target then source."""
        t, s = np.nonzero(self.mask.T)
        return s, t

    @cached_property
    def _columns(self) -> dict[str, np.ndarray]:
        """The edge table's name columns, built once per graph (a 12 x 12 model has 32k edges)."""
        s, t = self.edge_index
        sources = np.asarray(self.sources, dtype=object)
        targets = np.asarray([n for n, _ in self.targets], dtype=object)
        inputs = np.asarray([x for _, x in self.targets], dtype=object)
        return {"source": sources[s], "target": targets[t], "input": inputs[t]}

    @cached_property
    def _source_index(self) -> dict[str, int]:
        return {n: i for i, n in enumerate(self.sources)}

    @cached_property
    def _target_index(self) -> dict[tuple[str, str], int]:
        return {t: i for i, t in enumerate(self.targets)}

    def edges(self, scores: np.ndarray | None = None) -> pd.DataFrame:
        """One row per edge: ``source``, ``target``, ``input`` (and ``score``: ``scores
        [sources, targets]`` at each edge, when given)."""
        columns: dict[str, np.ndarray] = dict(self._columns)
        if scores is not None:
            columns["score"] = scores[self.edge_index]
        return pd.DataFrame(columns, copy=True)

    def edge(self, source: object, target: object, input: object = "") -> tuple[int, int]:
        """``(source index, target index)`` of an edge.

        Raises:
            InputError: no such node or edge; the message says what there is.
        """
        names = self._source_index
        if source not in names:
            raise InputError(
                f"No source node {source!r}: sources are 'input', heads as 'L0H1' (layers 0 to "
                f"{self.layers - 1}, heads 0 to {self.heads - 1}) and MLPs as 'M0'."
            )
        wanted = (target, input if input is not None else "")
        places = self._target_index
        if wanted not in places:
            raise InputError(
                f"No target {target!r} with input {input!r}: a head's input is 'q', 'k' or "
                "'v'; an MLP's and the logits' input is ''."
            )
        u, v = names[source], places[wanted]  # type: ignore[index]
        if not self.mask[u, v]:
            raise InputError(
                f"There is no edge {source} -> {target}{' ' + str(input) if input else ''}: "
                "edges run from a node into nodes downstream of it."
            )
        return u, v

    def selection(self, edges: pd.DataFrame | Iterable[Sequence[Any]]) -> np.ndarray:
        """``[sources, targets]`` True for the edges given (rows or a table with ``source``,
        ``target`` and ``input``).

        Raises:
            InputError: an edge that is not in the graph.
        """
        if isinstance(edges, pd.DataFrame):
            missing = {"source", "target", "input"} - set(edges.columns)
            if missing:
                raise InputError(f"The edge table lacks the columns {sorted(missing)}.")
            # column-wise costs ~2 ms whatever the size; row by row ~0.6 us a row
            found = self._indices(edges) if len(edges) > 4096 else None
            if found is not None:
                chosen = np.zeros(self.mask.shape, dtype=bool)
                chosen[found] = True
                return chosen
            rows: Iterable[Sequence[Any]] = edges[["source", "target", "input"]].itertuples(
                index=False
            )
        else:
            rows = edges
        chosen = np.zeros(self.mask.shape, dtype=bool)
        for row in rows:
            row = tuple(row)
            if len(row) not in (2, 3):
                raise InputError(f"An edge is (source, target, input); got {row!r}.")
            chosen[self.edge(*row)] = True
        return chosen

    def indices(self, edges: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        """``(source, target)`` indices of each row of an edge table, in the table's order (a
        table in the graph's own order, as ``edges`` builds it, is recognised without a lookup).

        Raises:
            InputError: a missing column, or an edge that is not in the graph.
        """
        missing = {"source", "target", "input"} - set(edges.columns)
        if missing:
            raise InputError(f"The edge table lacks the columns {sorted(missing)}.")
        own = self._columns
        if len(edges) == len(own["source"]) and all(
            np.array_equal(edges[c].to_numpy(dtype=object), own[c]) for c in own
        ):
            return self.edge_index
        found = self._indices(edges)
        if found is None:
            rows = edges[["source", "target", "input"]].itertuples(index=False)
            pairs = np.asarray([self.edge(*r) for r in rows], dtype=np.int64).reshape(-1, 2)
            found = pairs[:, 0], pairs[:, 1]
        return found

    def top_masks(self, scores: pd.DataFrame, counts: Sequence[int]) -> list[np.ndarray]:
        """``[sources, targets]`` masks of the top-n edges of ``scores`` by ``|score|`` for each
        n in ``counts`` (MIB's ``apply_topn`` with ``absolute=True``; ties keep the table's
        order, as ``mhsa.circuits.top_edges``), the table looked up once.

        Raises:
            InputError: as ``indices``.
        """
        s, t = self.indices(scores)
        order = np.argsort(-scores["score"].abs().to_numpy(), kind="stable")
        masks = []
        for n in counts:
            mask = np.zeros(self.mask.shape, dtype=bool)
            mask[s[order[:n]], t[order[:n]]] = True
            masks.append(mask)
        return masks

    def _indices(self, edges: pd.DataFrame) -> tuple[np.ndarray, np.ndarray] | None:
        """``(source, target)`` indices of a table's edges, looked up column-wise; None when
        one is not in the graph (``selection`` then names it, row by row)."""
        try:
            u = edges["source"].map(self._source_index)
            keys = pd.MultiIndex.from_arrays([edges["target"], edges["input"].fillna("")])
            v = pd.Index(list(self._target_index)).get_indexer(keys)
        except (TypeError, ValueError):  # unhashable or odd cells: the row-by-row path names them
            return None
        if u.isna().any() or bool((v < 0).any()):
            return None
        s, t = u.to_numpy(dtype=np.int64), np.asarray(v, dtype=np.int64)
        if not self.mask[s, t].all():
            return None
        return s, t


@cache
def graph_of(layers: int, heads: int, parallel: bool = False) -> CircuitGraph:
    """The ``CircuitGraph`` of that shape, built once (its edge lists and tables cached)."""
    return CircuitGraph(layers, heads, parallel)
