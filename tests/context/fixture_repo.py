"""A small multi-language repository, written to a folder on demand (no git, no network)."""
from __future__ import annotations

from pathlib import Path

FILES = {
    "README.md": "# demo\n\nA tiny multi-language project used by the context tests.\n",
    "app.py": "from pkg.core import Core\n\n\ndef main():\n    return Core().run()\n",
    "pkg/__init__.py": '"""The demo package."""\n',
    "pkg/util.py": "def helper(x):\n    return x * 2\n\n\nLIMIT = 10\n",
    "pkg/core.py": ("from .util import helper\n\n\nclass Core:\n    def run(self):\n"
                    "        return helper(21)\n"),
    "web/src/lib.ts": "export function add(a: number, b: number): number {\n  return a + b;\n}\n",
    "web/src/index.ts": "import { add } from './lib';\n\nexport const total = (n: number) => add(n, 1);\n",
    "web/src/view.tsx": ("import { total } from './index';\n\n"
                         "export function View(): JSX.Element {\n  return <div>{total(2)}</div>;\n}\n"),
    "web/src/legacy.js": "const lib = require('./lib');\nfunction legacy() { return lib.add(1, 2); }\n",
    "go.mod": "module example.com/demo\n\ngo 1.22\n",
    "internal/store/store.go": ("package store\n\ntype Store struct{ n int }\n\n"
                                "func New() *Store { return &Store{} }\n"),
    "cmd/demo/main.go": ('package main\n\nimport "example.com/demo/internal/store"\n\n'
                         "func main() { _ = store.New() }\n"),
    "crate/src/lib.rs": "mod parser;\nuse crate::parser::Parser;\n\npub fn parse() -> Parser { Parser::new() }\n",
    "crate/src/parser.rs": ("pub struct Parser;\n\nimpl Parser {\n    pub fn new() -> Self { Parser }\n}\n"),
    "java/com/demo/util/Strings.java": ("package com.demo.util;\n\npublic class Strings {\n"
                                        "    public static String twice(String s) { return s + s; }\n}\n"),
    "java/com/demo/App.java": ("package com.demo;\n\nimport com.demo.util.Strings;\n\npublic class App {\n"
                               "    public static void main(String[] a) { Strings.twice(\"x\"); }\n}\n"),
    "native/vec.h": "#ifndef VEC_H\n#define VEC_H\ntypedef struct { int n; } vec;\nint vec_len(vec *v);\n#endif\n",
    "native/vec.c": '#include "vec.h"\n\nint vec_len(vec *v) { return v->n; }\n',
    "native/shape.hpp": "#pragma once\nclass Shape {\n public:\n  double area() const;\n};\n",
    "native/shape.cpp": '#include "shape.hpp"\n\ndouble Shape::area() const { return 1.0; }\n',
    "node_modules/left-pad/index.js": "module.exports = () => 0;\n",
    "package-lock.json": "{}\n",
    "dist/bundle.min.js": "var a=1;\n",
}
BINARY = {"logo.png": b"\x89PNG\r\n\x1a\n\x00\x00", "data.bin.txt": b"abc\x00def"}


def write(root: Path) -> Path:
    """Writes the fixture files under `root` and returns it."""
    for rel, text in FILES.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, encoding="utf-8")
    for rel, data in BINARY.items():
        (root / rel).write_bytes(data)
    return root
