"""``tileops coverage TARGET --model CONFIG``: which ops of this model am I still missing?

Builds the model from CONFIG (a Hugging Face config.json, a folder holding one, or a
model type such as 'llama') on the meta device — no weights, no memory, nothing
downloaded — enables tileops on it with the transformers integration
(enable(model, target=TARGET, strict=False)) and reads which tileops ops the patched
forward calls. Lists each op, how many modules use it, whether TARGET registers a builder
for it, and the missing ones in the order to write them: most-used first, since each one
written takes the most modules off torch (and any one missing stops the model on TARGET:
there is no fall back). What stays on torch is listed too. Exit status 1 when an op is
missing or the integration cannot serve the model. Needs transformers
(pip install 'tileops[transformers]').
"""

from __future__ import annotations

import argparse
import importlib.util
import os
from pathlib import Path
from typing import Any

from ._common import Table, UsageError, add_json_option, check_target, report


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "coverage",
        help="which ops a Hugging Face model uses, and which the target still lacks",
        description=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("target", metavar="TARGET", help="a registered target, e.g. native_cpu")
    parser.add_argument(
        "--model", metavar="CONFIG", required=True, help="a config.json (or its folder), or a model type such as llama"
    )
    parser.add_argument(
        "--dtype",
        choices=("bfloat16", "float16"),
        default="bfloat16",
        help="the dtype the model would run in (default bfloat16)",
    )
    add_json_option(parser)
    parser.set_defaults(run=run)


def _transformers() -> Any:
    try:
        if importlib.util.find_spec("transformers") is None:
            raise ImportError("No module named 'transformers'")
        import transformers
    except ImportError as error:
        raise UsageError(
            "coverage needs transformers, which is not installed here: it reads which ops a "
            "model's forward uses from tileops' transformers integration. Install it with "
            f"pip install 'tileops[transformers]' ({type(error).__name__}: {error})"
        ) from None
    return transformers


def load_config(text: str) -> Any:
    transformers = _transformers()
    path = Path(text)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a config is read, never fetched
    if path.is_file():
        return _config_from_file(transformers, path)
    if path.is_dir():
        try:
            return transformers.AutoConfig.from_pretrained(str(path))
        except (OSError, ValueError, KeyError) as error:
            raise UsageError(f"--model: {str(path)!r} is not a readable Hugging Face config: {error}") from None
    from transformers import CONFIG_MAPPING

    if text in CONFIG_MAPPING:
        return transformers.AutoConfig.for_model(text)
    import difflib

    close = difflib.get_close_matches(text, list(CONFIG_MAPPING.keys()), n=3)
    hint = f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""
    raise UsageError(
        f"--model: expected a config.json path, a folder holding one, or a transformers model "
        f"type such as 'llama' or 'qwen3'; got {text!r}, which is neither a file nor a known "
        f"model type{hint}"
    )


def _config_from_file(transformers: Any, path: Path) -> Any:
    import json

    try:
        data = json.loads(path.read_text())
        model_type = data["model_type"]
    except (OSError, ValueError, KeyError) as error:
        raise UsageError(
            f"--model: {str(path)!r} is not a Hugging Face config (expected JSON with a "
            f"model_type): {type(error).__name__}: {error}"
        ) from None
    return transformers.AutoConfig.for_model(model_type, **{k: v for k, v in data.items() if k != "model_type"})


def run(args: argparse.Namespace) -> int:
    target = check_target(args.target)
    config = load_config(args.model)
    import torch

    from ..backend import registered_targets
    from ..integrations.transformers import UnsupportedModelError, enable
    from ..integrations.transformers.coverage import ops_used

    transformers = _transformers()
    dtype = getattr(torch, args.dtype)
    try:
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    except (ValueError, KeyError, TypeError) as error:
        raise UsageError(f"--model: transformers cannot build a causal LM from this config: {error}") from None
    model.eval()
    model_name = type(model).__name__
    try:
        enable_report = enable(model, target=target, strict=False)
    except UnsupportedModelError as error:
        table = Table(f"coverage: {model_name} on target {target}", ["op", "uses", "registered", "write order"])
        table.notes.append(f"the transformers integration cannot serve this model: {error}")
        report(args, [table], {"target": target, "model": model_name, "served": False, "error": str(error)})
        return 1
    uses = ops_used(model)
    first_seen = {op: i for i, op in enumerate(uses)}
    missing = sorted(
        (op for op in uses if target not in registered_targets(op)), key=lambda op: (-uses[op], first_seen[op])
    )
    order = {op: i + 1 for i, op in enumerate(missing)}
    table = Table(
        f"coverage: {model_name} on target {target}",
        ["op", "uses", "registered", "write order"],
    )
    for op in sorted(uses, key=lambda op: (op in order, order.get(op, 0), -uses[op])):
        table.add(op, uses[op], "yes" if op not in order else "MISSING", order.get(op))
    table.notes.append(
        f"{len(uses) - len(missing)} of {len(uses)} ops registered; "
        + (
            f"missing, in the order to write them: {', '.join(missing)}"
            if missing
            else f"{model_name} runs entirely on tileops ops that {target} serves"
        )
    )
    on_torch = Table("stays on torch (not a tileops op, or not served)", ["module", "feature", "why"], key="on_torch")
    for module, feature, why in enable_report.on_torch:
        on_torch.add(module, feature, why)
    report(
        args,
        [table, on_torch],
        {
            "target": target,
            "model": model_name,
            "served": True,
            "ops": dict(uses),
            "registered": [op for op in uses if op not in order],
            "missing": missing,
        },
    )
    return 1 if missing else 0
