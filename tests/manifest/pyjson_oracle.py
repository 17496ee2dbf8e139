"""Independent oracle for k3pack's Python-compatible JSON writer.

Reads a JSON array of documents (argv[1]) and writes, for each document, the
text CPython's json.dumps produces in each style k3pack reproduces, plus the
canonical SHA-256, as one ASCII JSON object per line to argv[2].
"""
import hashlib
import json
import sys

STYLES = {
    "indent2": dict(ensure_ascii=False, indent=2, sort_keys=True),
    "canonical": dict(ensure_ascii=False, sort_keys=True, separators=(",", ":")),
    "indent2_ascii": dict(indent=2, sort_keys=True),
    "canonical_ascii": dict(sort_keys=True, separators=(",", ":")),
    "default_ascii": dict(sort_keys=True),
}

with open(sys.argv[1], encoding="utf-8") as f:
    docs = json.load(f)
with open(sys.argv[2], "w", encoding="ascii") as out:
    for doc in docs:
        rec = {name: json.dumps(doc, **kw) for name, kw in STYLES.items()}
        rec["canonical_sha256"] = hashlib.sha256(rec["canonical"].encode("utf-8")).hexdigest()
        rec["repr"] = repr(doc)
        out.write(json.dumps(rec) + "\n")
