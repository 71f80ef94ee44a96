"""The notebooks of docs/notebooks run top to bottom in a fresh kernel (nbclient), and are kept
in git without outputs."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "docs" / "notebooks").glob("*.ipynb"))


def _run(path: Path) -> nbformat.NotebookNode:
    nb = nbformat.read(path, as_version=4)
    NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": ROOT}}
    ).execute()
    return nb


def _outputs(nb: nbformat.NotebookNode, source: str) -> list[dict]:
    """The outputs of the code cell whose source is ``source``, else the first that starts so."""
    code = [c for c in nb.cells if c.cell_type == "code"]
    cell = next((c for c in code if c.source == source), None)
    cell = cell or next(c for c in code if c.source.startswith(source))
    return cell.outputs


def test_the_notebooks_are_there() -> None:
    assert {p.name for p in NOTEBOOKS} == {"quickstart.ipynb", "from_elsewhere.ipynb"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_stored_without_outputs(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(c.outputs == [] and c.execution_count is None for c in code)


@pytest.mark.slow
def test_quickstart_runs() -> None:
    nb = _run(ROOT / "docs" / "notebooks" / "quickstart.ipynb")
    view = _outputs(nb, "r")
    assert 'class="mhsa-data"' in view[0]["data"]["text/html"]  # the result shows itself
    best = _outputs(nb, "best = ")[0]["data"]["text/html"]
    assert '"layers": ["L0", "L1"]' in best  # the toy model's view
    table = _outputs(nb, "edges = ")[0]["data"]["text/plain"]
    assert "score" in table
    neuron = _outputs(nb, "mhsa.attend(")[0]["data"]["text/html"]  # q and k embedded
    assert '"kv": "' in neuron and '"scale": 0.17677' in neuron
    assert 'class="mhsa-cell"' in _outputs(nb, "mhsa.show(patched)")[0]["data"]["text/html"]
    assert (
        'class="mhsa-edge"' in _outputs(nb, "mhsa.show(mhsa.circuits.top")[0]["data"]["text/html"]
    )
    atlas = _outputs(nb, "import tempfile")[0]["data"]["text/html"]  # the atlas shows itself
    assert "Atlas of toy:induction: 8 heads" in atlas and "induction score" in atlas
    assert atlas.count('class="mhsa-cell"') == 8  # its map
    top = _outputs(nb, "head = atlas")[0]["data"]["text/plain"]
    assert "key_token" in top and "<<" in top  # its top pairs, the key marked


@pytest.mark.slow
def test_from_elsewhere_runs() -> None:
    nb = _run(ROOT / "docs" / "notebooks" / "from_elsewhere.ipynb")
    difference = float(_outputs(nb, "ours = ")[0]["data"]["text/plain"])
    assert 0 <= difference < 1e-5  # from_attention's weights are attend's
    assert _outputs(nb, "stacked = ")[0]["data"]["text/plain"] == "6"
