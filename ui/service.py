"""Deprecated: the service layer now lives in ``ui.core`` (queries, models, the shared cache, the
heavy queue's glue), ``ui.runtime``, ``ui.exports`` and one module per feature in ``ui/views/``
(CONTRIBUTING.md, "Where a feature's UI lives"). Every name this module had still resolves here
for one release, with a ``DeprecationWarning`` naming its new home."""

from __future__ import annotations

import importlib
import warnings

#: each old name of ``ui.service`` and the module that holds it now
MOVED = {
    name: home
    for home, names in {
        "ui.core": (
            "LIMITS Progress Query VALUES attention cached can_generate compute_and_keep "
            "heavy_queue is_encoder_decoder loaded_model model_facts result_cache shown "
            "shown_rows"
        ),
        "ui.runtime": "GC_EVERY_RUNS collect_now_and_then",
        "ui.exports": "figure_csv figures_zip file_stem result_file",
        "mhsa.analysis.tables": "agreement_table token_table",
        "ui.views.statistics": "corpus_stats first_sentence_stats head_stats head_stats_and_roles",
        "ui.views.similarity": "head_clusters head_map head_similarity",
        "ui.views.importance": (
            "ablation importance importance_and_pruning importance_stats knock_out_kind "
            "knock_out_labels pruning"
        ),
        "ui.views.roles": (
            "CUSTOM_ROLE CUSTOM_RULES CompositionView ERROR_MEASURES MAX_RULE_K ROLE_DETECTORS "
            "RULES_WITH_K RoleOptions RoleTable SinkView TYPED_RULE attention_sinks custom_role "
            "head_composition head_roles random_induction sink_value_norms strongest_inputs "
            "token_attention top_heads"
        ),
        "ui.views.patching": (
            "MAX_POSITION_TOKENS PATCH_MODES PatchSettings PatchingView patch_tokens patching"
        ),
        "ui.views.flow": (
            "FLOW_MAX_TOKENS flow_contributions flow_graph flow_key flow_text head_attribution "
            "logit_lens predicted_words"
        ),
        "ui.views.rollout": "rollout",
        "ui.views.classroom": "classroom classroom_cross",
    }.items()
    for name in names.split()
}


def __getattr__(name: str) -> object:
    module = MOVED.get(name)
    if module is None:
        raise AttributeError(f"module 'ui.service' has no attribute {name!r}")
    warnings.warn(
        f"ui.service.{name} is deprecated: use {module}.{name} (ui.service goes in the next "
        "release).",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(importlib.import_module(module), name)
