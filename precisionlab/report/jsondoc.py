"""The --json envelope: every command's document is one strict JSON object
(non-finite floats as "nan", "inf", "-inf") with the same head."""

from __future__ import annotations

import json
import math
import sys

import numpy as np

from precisionlab.io.urls import mask_secrets
from precisionlab.runtime.machine import cpu_name, versions

# ---------------------------------------------------------------------------
# JSON


def jsonable(obj):
    """Plain JSON types; non-finite floats become "nan", "inf", "-inf"; a URL's credentials masked
    (io.urls: engine_spec, params' url, ...)."""
    if isinstance(obj, str):
        return mask_secrets(obj)
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        x = float(obj)
        if math.isnan(x):
            return "nan"
        if math.isinf(x):
            return "inf" if x > 0 else "-inf"
        return x
    if isinstance(obj, np.ndarray):
        return jsonable(obj.tolist())
    return obj




# Every --json document's "schema_version": bumped when a field is renamed,
# removed or changes meaning (adding a field keeps it), so scripts can check.
SCHEMA_VERSION = 7  # 2: one name per quantity (docs/json.md); 3: "method" / "kernel" became "variant";
# 4: compare logits' REF fields by role (ppl_ref, ...); 5: compare model's modes became verbs (issue 38),
# formats' rel_rmse became rel_l2 (the same quantity), compare metrics' ppl_fp32 became ppl_ref;
# 6: compare metrics' and kvcache's top-5 shares by role too (ref_top1_in_top5_pct, top1_in_ref_top5_pct)
# and flip_share; 7: compare layers' two-model form became compare engine-layers, --draft-tokens --draft tokens:


def emit_json(command: str, doc: dict) -> None:
    from precisionlab import native

    head = {"schema_version": SCHEMA_VERSION, "command": command, "versions": versions(), "cpu_name": cpu_name()}
    try:
        head["library"] = {"path": native.library_path(), "abi": native.ABI_VERSION}
    except Exception:  # the JSON of a command that never needed the library
        head["library"] = None
    text = json.dumps(jsonable({**head, **doc}), allow_nan=False, indent=2)
    sys.stdout.write(text + "\n")


def emit_rows(command: str, res, **fields) -> None:
    """The document of a result made of params, rows and takeaways (as
    report.output.Rows): `fields` stand between params and rows, in the order
    given."""
    emit_json(command, {"params": res.params, **fields, "rows": res.rows, "takeaways": res.takeaways})
