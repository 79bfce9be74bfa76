"""The documentation's links and references hold (CTest docs.links, beside docs.config_keys):

  - every relative link of README.md and docs/*.md ([text](path) or [text](path#anchor)) names a file or
    folder of the checkout, and every anchor names a heading of its page (GitHub's slugs: lower case,
    punctuation but hyphens and spaces dropped, spaces as hyphens, a -N suffix for repeated headings);
  - no file of the project cites a work tracker ("issue 12", "per issue", "the issue sets"): the docs and
    comments are references, their history is git's;
  - no source under src/ or include/ says its code waits for a GPU in words of its own ("not yet measured
    on a GPU"): such code points to the one table of it, docs/platform.md's "Awaiting a GPU";
  - no source under src/, include/ or cli/ includes a file of the lab (lab/lab.h: the kernels awaiting a
    GPU live in a target the library never links; the programs that carry it add lab/with_lab.cpp).

    python3 tests/docs_links.py SOURCE_DIR      (exit 1 with one line per fault)
"""
import os
import re
import subprocess
import sys

LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
WAITING = re.compile(r"(?i)\bnot (yet )?(been )?(run|measured|timed)( yet)? on a GPU|\buntil a GPU\b")
LAB_INCLUDE = re.compile(r'^\s*#\s*include\s*"[^"]*\blab/')
TRACKER = re.compile(r"(?i)(\b(issue|task|ticket)s?[- #]*\d+\b|\bper issue\b|\bthe issue (sets|asks|says|requires|wants)\b"
                     r"|\btracker\b)")


def slug(heading):
    """GitHub's anchor of a heading's text."""
    text = re.sub(r"`([^`]*)`", r"\1", heading)                     # code spans keep their text
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)             # links keep their text
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)                            # punctuation but - and _ goes
    return text.replace(" ", "-")


def anchors(path):
    seen, result = {}, set()
    in_code = False
    for line in open(path, encoding="utf-8"):
        if line.startswith("```"):
            in_code = not in_code
            continue
        m = None if in_code else HEADING.match(line)
        if m:
            base = slug(m.group(2))
            n = seen.get(base, 0)
            result.add(base if n == 0 else f"{base}-{n}")
            seen[base] = n + 1
    return result


def check_links(source):
    faults = []
    pages = [os.path.join(source, "README.md")] + sorted(
        os.path.join(source, "docs", f) for f in os.listdir(os.path.join(source, "docs")) if f.endswith(".md"))
    for page in pages:
        in_code = False
        for number, line in enumerate(open(page, encoding="utf-8"), 1):
            if line.startswith("```"):
                in_code = not in_code
            if in_code:
                continue
            for target in LINK.findall(line):
                if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                    continue
                path, _, anchor = target.partition("#")
                where = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
                name = f"{os.path.relpath(page, source)}:{number}"
                if not os.path.exists(where):
                    faults.append(f"{name}: link to {target}: no such file")
                elif anchor and where.endswith(".md") and anchor not in anchors(where):
                    faults.append(f"{name}: link to {target}: no heading '{anchor}' in {os.path.relpath(where, source)}")
    return faults


def check_trackers(source):
    listed = subprocess.run(["git", "-C", source, "ls-files"], capture_output=True, text=True)
    if listed.returncode == 0:
        files = listed.stdout.split()
    else:  # not a git checkout (an unpacked archive): the project's own folders
        files = [os.path.relpath(os.path.join(d, f), source)
                 for top in ("README.md", "CMakeLists.txt", "src", "include", "cli", "tests", "bench", "scripts",
                             "python", "docs", "cmake", "configs", "examples")
                 for d, _, names in (os.walk(os.path.join(source, top)) if os.path.isdir(os.path.join(source, top))
                                     else [(source, [], [top])])
                 for f in names]
    faults = []
    for f in files:
        if f.startswith("third_party/") or f == "tests/docs_links.py" or f.startswith("tests/fuzz/"):
            continue
        path = os.path.join(source, f)
        try:
            text = open(path, encoding="utf-8").read()
        except (UnicodeDecodeError, IsADirectoryError, FileNotFoundError):
            continue
        for number, line in enumerate(text.splitlines(), 1):
            m = TRACKER.search(line)
            if m:
                faults.append(f"{f}:{number}: cites a work tracker ('{m.group(0)}')")
            w = WAITING.search(line) if f.startswith(("src/", "include/")) else None
            if w:
                faults.append(f"{f}:{number}: says '{w.group(0)}': point to docs/platform.md's \"Awaiting a GPU\" instead")
            if f.startswith(("src/", "include/", "cli/")) and LAB_INCLUDE.search(line):
                faults.append(f"{f}:{number}: includes the lab ({line.strip()}): the library never names lab/")
    return faults


def main():
    source = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    faults = check_links(source) + check_trackers(source)
    for fault in faults:
        print(f"FAIL: {fault}")
    print(f"docs links: {len(faults)} faults")
    return 1 if faults else 0


if __name__ == "__main__":
    sys.exit(main())
