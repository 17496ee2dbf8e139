"""docs/python.md against the module a reader imports: every public name is
documented, every `k3pack.X`,
`k3pack.X.Y` and `k3pack.sglang.X` it names exists, and every call it writes
in signature form (`k3pack.f(a, b, c=..., ...)`) uses the real parameter
names, so a reader who copies a keyword from the docs does not get a
TypeError. A docs/python.md that drifts from the bindings fails here."""

import inspect
import os
import re
import unittest

import _util
import k3pack
import k3pack.sglang

DOC = os.path.join(_util.REPO, "docs", "python.md")
# Keys of the manifest's and the stats' "k3pack" object, spelled like module members.
JSON_KEYS = {"k3pack.ep"}


def parameters(obj):
    """Parameter names of a Python function or a pybind11 callable, in order."""
    if inspect.isclass(obj):
        obj = obj.__init__
    try:
        names = list(inspect.signature(obj).parameters)
    except (TypeError, ValueError):
        # pybind11 puts the signature on the docstring's first line (overloads:
        # "Overloaded function." then one per numbered line; the first is taken).
        doc = obj.__doc__ or ""
        m = re.search(r"^\s*(?:\d+\. )?\w+\((.*?)\)\s*->", doc, re.M)
        if not m:
            return None
        names = [p.split(":")[0].strip() for p in split_args(m.group(1))]
    return [n for n in names if n not in ("self", "*", "/") and not n.startswith("**")
            and not n.startswith("*")]


def split_args(text):
    """Top-level comma split (brackets, parentheses and quotes nest)."""
    out, depth, cur, quote = [], 0, "", None
    for ch in text:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
            continue
        cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out


def resolve(dotted):
    obj = k3pack
    for part in dotted.split(".")[1:]:
        obj = getattr(obj, part)
    return obj


def doc_calls():
    """(line, dotted name, argument text or None) for each `k3pack.` name in the doc."""
    with open(DOC) as f:
        text = f.read()
    out = []
    for lineno, line in enumerate(text.split("\n"), 1):
        for m in re.finditer(r"(?<![\w.])(k3pack(?:\.[A-Za-z_]\w*)+)(\()?", line):
            name = m.group(1)
            args = None
            if m.group(2):
                depth, i = 1, m.end()
                while i < len(line) and depth:
                    depth += {"(": 1, ")": -1}.get(line[i], 0)
                    i += 1
                args = line[m.end():i - 1] if depth == 0 else None
            out.append((lineno, name, args))
    return out


class PythonDocNamesTheRealApi(unittest.TestCase):
    def test_every_public_name_is_documented(self):
        with open(DOC) as f:
            text = f.read()
        # `(?!\.\w)`: `ggml_types.h` does not document `ggml_types`.
        undocumented = [m.__name__ + "." + n for m in (k3pack, k3pack.sglang) for n in m.__all__
                        if not re.search(r"(?<![\w.])(?:k3pack\.(?:sglang\.)?)?%s\b(?!\.\w)" % re.escape(n), text)]
        self.assertEqual(undocumented, [])

    def test_every_named_member_exists(self):
        missing = []
        for lineno, name, _ in doc_calls():
            if name in JSON_KEYS:
                continue
            try:
                resolve(name)
            except AttributeError:
                missing.append("docs/python.md:%d: %s" % (lineno, name))
        self.assertEqual(missing, [])

    def test_signature_form_calls_use_the_real_parameter_names(self):
        wrong = []
        checked = 0
        for lineno, name, args in doc_calls():
            if args is None or ("=" not in args and "..." not in args):
                continue  # a plain call with variables (`nonexpert_tensors(m)`), not a signature
            params = parameters(resolve(name))
            if params is None:
                continue
            checked += 1
            positional = True
            for i, arg in enumerate(split_args(args)):
                arg = re.sub(r"\[.*\]$", "", arg)  # `topk_ids[tokens, top_k]`: a shape note
                if arg in ("...", "*") or arg.startswith("**"):
                    positional = False
                    continue
                kw = re.match(r"^(\w+)\s*=", arg)
                if kw:
                    positional = False
                    if kw.group(1) not in params:
                        wrong.append("docs/python.md:%d: %s has no parameter %r (it has %s)"
                                     % (lineno, name, kw.group(1), params))
                elif positional and re.fullmatch(r"[a-z_]\w*", arg):
                    if i >= len(params) or params[i] != arg:
                        wrong.append("docs/python.md:%d: %s: argument %d is %r in the doc, %r in the code"
                                     % (lineno, name, i + 1, arg, params[i] if i < len(params) else None))
        self.assertGreater(checked, 5, "no signature-form call found in docs/python.md")
        self.assertEqual(wrong, [], "\n".join(wrong))


if __name__ == "__main__":
    unittest.main()
