#!/usr/bin/env python3
"""Markdown tables of `k3pack trace sweep --family all --json` (docs/store.md).

    k3pack trace sweep --family all --svg docs/plots/trace-sweep.svg --json \\
        --policies lru,reuse-lfu-lru-v2,decay-lfu,quota-decay,request-aware,adaptive --learner > sweep.json
    scripts/sweep-tables.py sweep.json

One table per family: every policy's hit rate, Belady, the informed bound,
the learning reference (with --learner), adaptive's ratios to them and its
gap to the best other policy, in points.
"""
import json
import sys

COLUMNS = [("lru", "lru"), ("reuse-lfu-lru-v2", "SGLang"), ("decay-lfu", "decay-lfu"),
           ("quota-decay", "quota-decay"), ("request-aware", "request-aware"), ("adaptive", "**adaptive**"),
           ("belady", "Belady"), ("informed", "informed"), ("learner", "learner")]
BOUNDS = ("belady", "informed", "learner")


def table(name, fam):
    rates = fam["hit_rate"]
    cols = [(k, title) for k, title in COLUMNS if k in rates]
    reuse = fam["measured_reuse"]  # null when no token follows another of its request
    shown = "n/a" if reuse is None else "%.1f%%" % (100 * reuse)
    out = ["`%s` (%d tokens, measured reuse %s):" % (name, fam["tokens"], shown), ""]
    head = ["cache (objects / share)"] + [t for _, t in cols]
    if "adaptive" in rates:
        head += ["adaptive / %s" % title for k, title in cols if k in BOUNDS]
        head += ["adaptive - best other"]
    out.append("| " + " | ".join(head) + " |")
    out.append("|" + "---:|" * len(head))
    for i, objects in enumerate(fam["capacity_objects"]):
        row = ["%d / %.2f%%" % (objects, 100.0 * objects / fam["num_objects"])]
        for k, _ in cols:
            v = "%.1f%%" % (100 * rates[k][i])
            row.append("**%s**" % v if k == "adaptive" else v)
        if "adaptive" in rates:
            a = rates["adaptive"][i]
            for bound in BOUNDS:
                if bound in rates:
                    row.append("%.2fx" % (a / rates[bound][i]) if rates[bound][i] > 0 else "-")
            others = [rates[k][i] for k, _ in cols if k not in ("adaptive",) + BOUNDS]
            row.append("%+.1f" % (100 * (a - max(others))) if others else "-")
        out.append("| " + " | ".join(row) + " |")
    return "\n".join(out)


def main():
    if len(sys.argv) != 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if len(sys.argv) == 2 else 2
    with open(sys.argv[1]) as f:
        doc = json.load(f)
    families = doc.get("families", {"trace": doc})
    print("\n\n".join(table(name, families[name]) for name in sorted(families)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
