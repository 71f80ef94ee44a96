"""Causal tools: what a head does to the output when it is changed. What is measured
(``metrics``: the output's registry; ``targets``: a task's answers), knocking heads out
(``importance``, ``pruning``), activation patching and attribution patching (``patching``,
``patch_runs``), direct logit attribution and the logit lens (``attribution``) and information
flow (``flow``).

May import: ``mhsa.engine``, ``mhsa.analysis`` and the shared top-level modules
(``tests/test_layers.py``).
"""
