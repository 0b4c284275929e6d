#!/usr/bin/env python3
"""Generates one C++ translation unit that compiles every documentation example.

Usage: doc_examples.py [--source-dir DIR] --output FILE

Examples are
  * every fenced block of README.md whose info string is cpp (or c++, cxx, cc), and
  * every `@code ... @endcode` (or `\\code ... \\endcode`) block of a doc comment in
    include/pmap/**/*.hpp, the comment prefix (`///`, `//!` or ` *`) stripped. A block
    opened as `@code{.ext}` with an ext other than .cpp/.hpp/.cc is not C++: it is listed
    as such, not compiled.

Each example is compiled in one of three contexts. A block with `int main(` is a full
program; any other block is compiled as the body of a function, unless a marker names the
context. The marker is an HTML comment on the last non-blank line before the block (the
line before the fence in README.md, the doc-comment line before `@code`); Markdown and
Doxygen both leave it out of what they render:

    <!-- example-context: NAME -->

  program   a whole program (the default when the block has `int main(`): it is put in its
            own namespace, `int main(` renamed to `auto example_main_N(` (auto: main may
            end without `return`, any other function returning int may not).
  function  the default for a block without main: the body of `void example()` in the
            example's own namespace. The block declares what it uses.
  kernel    the body of a pmap kernel, `[](pmap::Context& ctx, auto x) { BLOCK }`, which
            may `return` a result. x is one device's slice, an
            Eigen::TensorMap<const Eigen::Tensor<float, 1, Eigen::RowMajor>>. The kernel is
            passed to pmap::pmap (axis "i") and called on a [8, 16] float tensor, so pmap's
            own compile-time checks of kernels (SPEC 2.2) apply to it; they report the
            block's opening line (the fence or `@code`).

Every example sees <pmap/pmap.hpp>. An `#include` line inside a block is moved to the top
of the translation unit (its line is left blank, so line numbers stay those of the source).
A line that is only `...` (an elided statement, optionally followed by a `//` comment)
compiles as nothing and is listed in the output; prefer real code.

Each example's lines are preceded by a `#line` directive naming its source file and line,
so the compiler's errors point at README.md:LINE or the header's line, and the script lists
every example as FILE:LINE (its first line of code) with the namespace it went to. The unit
is only compiled, never linked or run: tests/CMakeLists.txt builds it as the doc_examples
test (`ctest -L docs`).

Exits non-zero, with a message naming the file and line, when no example is found, a block
is not closed, a marker names an unknown context, or a marker contradicts the block.
"""

import argparse
import pathlib
import re
import sys

CPP_INFO = {"cpp", "c++", "cxx", "cc"}
CPP_CODE_EXT = {"", ".cpp", ".hpp", ".cc", ".cxx", ".h"}
CONTEXTS = ("program", "function", "kernel")

MARKER = re.compile(r"<!--\s*example-context:\s*([A-Za-z_-]+)\s*-->")
FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})\s*([^\s`]*)")
MAIN = re.compile(r"\bint\s+main\s*\(")
INCLUDE = re.compile(r"^\s*#\s*include\b")
PLACEHOLDER = re.compile(r"^\s*\.\.\.\s*;?\s*(//.*)?$")
SLASH_DOC = re.compile(r"^\s*//[/!]<?\s?(.*)$")
BLOCK_DOC_OPEN = re.compile(r"^\s*/\*[*!]<?\s?(.*)$")
BLOCK_DOC_LINE = re.compile(r"^\s*\*?\s?(.*)$")
CODE_OPEN = re.compile(r"^\s*[@\\]code(\{\.?(\w*)\})?\s*$")
CODE_CLOSE = re.compile(r"^\s*[@\\]endcode\s*$")


class Block:
    def __init__(self, path, rel, line, lines, marker, marker_line):
        self.path = path          # absolute path, for #line
        self.rel = rel            # path relative to the source dir, for messages
        self.line = line          # line number of the block's first line of code
        self.lines = lines        # the code, prefixes stripped
        self.marker = marker      # the context a marker names, or None
        self.marker_line = marker_line
        self.context = None

    def where(self):
        return f"{self.rel}:{self.line}"


def fail(message):
    print(f"doc_examples.py: error: {message}", file=sys.stderr)
    sys.exit(1)


def marker_before(texts, index):
    """The context named by a marker on the last non-blank line before texts[index]."""
    for j in range(index - 1, -1, -1):
        if texts[j].strip():
            match = MARKER.search(texts[j])
            return (match.group(1), j + 1) if match else (None, None)
    return None, None


def readme_blocks(path, rel):
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks, skipped = [], 0
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        fence, info = match.group(1), match.group(2).lower()
        close = re.compile(r"^\s{0,3}" + re.escape(fence[0]) + "{" + str(len(fence)) + r",}\s*$")
        j = i + 1
        while j < len(lines) and not close.match(lines[j]):
            j += 1
        if j == len(lines):
            fail(f"{rel}:{i + 1}: the fence opened here is never closed")
        marker, marker_line = marker_before(lines, i)
        if info in CPP_INFO:
            blocks.append(Block(path, rel, i + 2, lines[i + 1:j], marker, marker_line))
        elif marker:
            fail(f"{rel}:{marker_line}: example-context marker before a block that is not cpp")
        else:
            skipped += 1
        i = j + 1
    return blocks, skipped


def header_blocks(path, rel):
    lines = path.read_text(encoding="utf-8").splitlines()
    # The comment text of each line (None outside doc comments).
    texts, in_block = [], False
    for line in lines:
        text = None
        if in_block:
            end = line.find("*/")
            text = BLOCK_DOC_LINE.match(line if end < 0 else line[:end]).group(1)
            in_block = end < 0
        elif SLASH_DOC.match(line):
            text = SLASH_DOC.match(line).group(1)
        elif BLOCK_DOC_OPEN.match(line):
            text, in_block = BLOCK_DOC_OPEN.match(line).group(1), True
            if "*/" in text:
                text, in_block = text.split("*/", 1)[0], False
        texts.append(text)
    blocks, skipped = [], 0
    i = 0
    while i < len(lines):
        opened = CODE_OPEN.match(texts[i]) if texts[i] is not None else None
        if not opened:
            i += 1
            continue
        j = i + 1
        while j < len(lines) and not (texts[j] is not None and CODE_CLOSE.match(texts[j])):
            if texts[j] is None:
                fail(f"{rel}:{i + 1}: @code block not closed by @endcode within its comment")
            j += 1
        if j == len(lines):
            fail(f"{rel}:{i + 1}: @code without @endcode")
        ext = "." + opened.group(2) if opened.group(2) else ""
        marker, marker_line = marker_before([t or "" for t in texts], i)
        if ext.lower() in CPP_CODE_EXT:
            blocks.append(Block(path, rel, i + 2, texts[i + 1:j], marker, marker_line))
        elif marker:
            fail(f"{rel}:{marker_line}: example-context marker before a block that is not C++")
        else:
            skipped += 1
        i = j + 1
    return blocks, skipped


def classify(block):
    has_main = any(MAIN.search(line) for line in block.lines)
    context = block.marker or ("program" if has_main else "function")
    if context not in CONTEXTS:
        fail(f"{block.rel}:{block.marker_line}: unknown example context '{context}' "
             f"(one of: {', '.join(CONTEXTS)})")
    if context == "program" and not has_main:
        fail(f"{block.where()}: marked program, but the block has no `int main(`")
    if context != "program" and has_main:
        fail(f"{block.where()}: the block has `int main(` but is marked {context}")
    block.context = context


class Unit:
    """The generated translation unit, line by line (tracks its own line numbers)."""

    def __init__(self, output_name):
        self.lines = []
        self.output_name = output_name

    def add(self, *lines):
        self.lines.extend(lines)

    def back_to_self(self):
        # The next line is line len+2 of this file (after the directive itself).
        self.add(f'#line {len(self.lines) + 2} "{self.output_name}"')


def c_string(path):
    return str(path).replace("\\", "\\\\").replace('"', '\\"')


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source-dir", type=pathlib.Path,
                        default=pathlib.Path(__file__).resolve().parent.parent)
    parser.add_argument("--output", type=pathlib.Path, required=True)
    args = parser.parse_args()
    root = args.source_dir.resolve()

    blocks, skipped = [], []
    readme = root / "README.md"
    if not readme.is_file():
        fail(f"{readme} not found")
    found, n = readme_blocks(readme, "README.md")
    blocks += found
    if n:
        skipped.append(f"README.md: {n} fenced block(s) not in C++ (sh, text, ...)")
    headers = sorted((root / "include" / "pmap").rglob("*.hpp"))
    for header in headers:
        rel = header.relative_to(root).as_posix()
        found, n = header_blocks(header, rel)
        blocks += found
        if n:
            skipped.append(f"{rel}: {n} @code block(s) not in C++")
    if not blocks:
        fail(f"no C++ example found in {readme} or {root}/include/pmap/**/*.hpp")
    for block in blocks:
        classify(block)

    output = args.output.resolve()
    unit = Unit(c_string(output))
    includes, notes = ["#include <pmap/pmap.hpp>"], []
    for number, block in enumerate(blocks, start=1):
        code = []
        for offset, line in enumerate(block.lines):
            if INCLUDE.match(line):
                include = line.strip()
                if include not in includes:
                    includes.append(include)
                code.append("")
            elif PLACEHOLDER.match(line):
                notes.append(f"{block.rel}:{block.line + offset}: `...` compiled as nothing")
                code.append("// " + line.strip())
            elif block.context == "program":
                code.append(MAIN.sub(f"auto example_main_{number}(", line))
            else:
                code.append(line)
        block.code = code
        block.number = number

    unit.add("// Generated by tests/doc_examples.py: every C++ example of README.md and of the",
             "// doc comments of include/pmap/, one namespace each. Do not edit; edit the",
             "// example (each carries the #line of its source). Compiled, never run.")
    unit.add(*includes)
    for block in blocks:
        ns = f"doc_example_{block.number}"
        unit.add("", f"// {block.where()} ({block.context})", f"namespace {ns} {{")
        if block.context == "function":
            unit.add("void example() {")
        elif block.context == "kernel":
            unit.add("void example() {",
                     "  auto kernel = []([[maybe_unused]] pmap::Context& ctx, "
                     "[[maybe_unused]] auto x) {")
        unit.add(f'#line {block.line} "{c_string(block.path)}"')
        unit.add(*block.code)
        if block.context == "kernel":
            # The harness on one line, numbered as the block's opening line (the fence or
            # @code): pmap's checks of the kernel report "required from" there.
            unit.add(f'#line {block.line - 1} "{c_string(block.path)}"',
                     '  }; auto f = pmap::pmap(kernel, {.axis_name = "i"}); '
                     "Eigen::Tensor<float, 2, Eigen::RowMajor> xs(8, 16); xs.setZero(); "
                     "(void)f(xs);")
        unit.back_to_self()
        if block.context in ("function", "kernel"):
            unit.add("}")
        unit.add(f"}}  // namespace {ns}")

    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text("\n".join(unit.lines) + "\n", encoding="utf-8")

    print(f"doc_examples.py: {len(blocks)} C++ example(s) -> {output}")
    for block in blocks:
        kind = "full program" if block.context == "program" else f"fragment, {block.context}"
        print(f"  {block.where()}: doc_example_{block.number} ({kind})")
    for line in skipped + notes:
        print(f"  note: {line}")


if __name__ == "__main__":
    main()
