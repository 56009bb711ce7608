"""The settings a model folder carries (``mmrl_eval.json``): the prompt, generation and media settings a model
was trained with, so that ``mmrl eval --model`` and a run started from the folder use them. Written with the
weights (:func:`mmrl.engine.checkpoint.save_model`); read here without torch, as ``mmrl config show`` does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

EVAL_SETTINGS_FILE = "mmrl_eval.json"


def eval_settings(cfg: Any) -> dict[str, Any]:
    """What evaluating a model as it was trained needs, as a config fragment (``{section: {key: value}}``):
    the prompt, the generation length and stop strings, the media budgets and the evaluation settings of
    the run configuration ``cfg``."""
    from mmrl.config.io import to_dict

    return {"prompt": to_dict(cfg.prompt),
            "rollout": {"max_new_tokens": cfg.rollout.max_new_tokens, "stop": list(cfg.rollout.stop)},
            "data": {"media": to_dict(cfg.data.media)},
            "eval": {"max_new_tokens": cfg.eval.max_new_tokens, "batch_size": cfg.eval.batch_size,
                     "min_options": cfg.eval.min_options}}


def read_eval_settings(model_dir: str | Path) -> dict[str, Any] | None:
    """The evaluation settings stored in a model folder (:func:`eval_settings`), or None. An unreadable, cut or
    garbled file raises :class:`MmrlError` naming it (not a JSON traceback, nor settings taken for none)."""
    from mmrl_common.errors import MmrlError
    from mmrl_common.json_file import read_json_mapping

    path = Path(model_dir) / EVAL_SETTINGS_FILE
    if not path.is_file():
        return None
    data, why = read_json_mapping(path)
    if why is not None:
        raise MmrlError(f"{path} {why}: it holds the settings the model was trained with; copy or export the model "
                        "folder again, or pass --recipe-settings to use the recipe's settings instead")
    return data
