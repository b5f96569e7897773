"""The assembler `locus cc` puts in front of gcc's (gcc -B<dir>, <dir>/as runs this file): it
inlines the exact backend's hit test into gcc's -fsanitize=thread code, as LTO does for clang.

gcc instruments every load and store with a call, `call *__tsan_write8@GOTPCREL(%rip)`,
after its inliner has run: its hooks cannot be inlined, and the call per access made the
exact backend 15-40x slower than the plain program (each call about 2.5 ns). This rewrites
each plain read/write hook call in the assembly gcc hands its assembler into the hit test of
runtime/comm/exact/fast.h (locus_x_access with 64-byte lines), falling back to the same call
on a miss:

    key hit (the thread's cached shadow block) and the access inside one line, then
      read:  the line's copy set holds this thread          -> hit
      write: this thread wrote the line last and holds the only copy, and no new bytes -> hit
    anything else: the original call (which redoes the test and takes the slow path)

The rewrite is safe at a call site by the calling convention: the call clobbers rax, rcx,
rdx, rsi, r8-r11 and the flags, so the compiler keeps nothing live in them; the address is
in rdi, which the code leaves for the fallback call. The stack is not touched (no CFI
change, the fallback call runs at the call's own stack pointer), and the inserted code
carries the line of the access (the `.loc` before it), so the fallback's return address
names the access as before. Unaligned accesses take the test too (one that spans two lines
fails it and calls); ranges and atomics keep their calls.

The layout it reads (struct locus_xthread, struct locus_xshadow) is asserted in exact.c; when
it changes, locus_xt is renamed here and in fast.h, so that `locus record` refuses programs
built with the old one.
Usage (from the wrapper script `locus cc` writes): gas.py REAL_AS [as arguments...]. Input
without a __tsan_ call is assembled unchanged. Standalone: it imports nothing from locus, so
that the assembler step costs one bare interpreter start.
"""

from __future__ import annotations

import os
import re
import sys

# call *__tsan_write8@GOTPCREL(%rip) (-fno-plt), call __tsan_write8@PLT, call __tsan_write8
CALL = re.compile(
    r"^(\s*)callq?\s+\*?(__tsan_(?:volatile_|unaligned_)?(read|write)(1|2|4|8|16))"
    r"(@GOTPCREL\(%rip\)|@PLT)?\s*(?:#.*)?$"  # -fverbose-asm ends lines with a comment
)

# struct locus_xthread (fast.h): key, b, accesses, bit, token; struct locus_xshadow (32
# bytes): wip, bytes, copies. Lines of 64 bytes, 2^16 lines per shadow block.
HIT = """\
{i}# locus: exact hit test of {hook} inlined (python/locus/gas.py)
{i}movq\t%rdi, %rsi
{i}shrq\t$22, %rsi
{i}notq\t%rsi
{i}movq\tlocus_xt@GOTTPOFF(%rip), %rax
{i}cmpq\t%fs:(%rax), %rsi
{i}jne\t.Llocus_miss{k}
{i}movl\t%edi, %ecx
{i}andl\t$63, %ecx
{i}cmpl\t${last}, %ecx
{i}ja\t.Llocus_miss{k}
{i}movl\t%edi, %edx
{i}andl\t$4194240, %edx
{i}shrl\t%edx
{i}addq\t%fs:8(%rax), %rdx
{i}movq\t16(%rdx), %r8
"""
READ = """\
{i}testq\t%r8, %fs:24(%rax)
{i}je\t.Llocus_miss{k}
"""
WRITE = """\
{i}cmpq\t%fs:24(%rax), %r8
{i}jne\t.Llocus_miss{k}
{i}movzwl\t6(%rdx), %r9d
{i}cmpl\t%fs:40(%rax), %r9d
{i}jne\t.Llocus_miss{k}
{i}movq\t${mask}, %r10
{i}salq\t%cl, %r10
{i}movq\t8(%rdx), %r11
{i}orq\t%r11, %r10
{i}cmpq\t%r11, %r10
{i}jne\t.Llocus_miss{k}
"""
TAIL = """\
{i}addq\t$1, %fs:16(%rax)
{i}jmp\t.Llocus_hit{k}
.Llocus_miss{k}:
{call}
.Llocus_hit{k}:
"""


def rewrite(text: str, first: int = 0) -> tuple[str, int]:
    """The assembly with every plain read/write hook call preceded by the inlined hit test,
    and how many calls were rewritten; labels are numbered from `first` (unique across the
    files of one assembler run)."""
    # Only x86-64 code in AT&T syntax (gcc -masm=intel, -m32 and -mx32 keep their calls).
    if "__tsan_" not in text or ".intel_syntax" in text or ".code32" in text:
        return text, 0
    out: list[str] = []
    k = first
    for line in text.splitlines(keepends=True):
        m = CALL.match(line)
        if not m:
            out.append(line)
            continue
        indent, hook, kind, size = m.group(1) or "\t", m.group(2), m.group(3), int(m.group(4))
        args = {"i": indent, "k": k, "hook": hook, "last": 64 - size}
        args["mask"] = (1 << size) - 1
        args["call"] = line.rstrip("\n")
        out.append(HIT.format(**args))
        out.append((READ if kind == "read" else WRITE).format(**args))
        out.append(TAIL.format(**args))
        k += 1
    return "".join(out), k - first


# GNU as options followed by a separate value.
VALUE_OPTIONS = {"-o", "-I", "-MD", "--defsym"}


def inputs(args: list[str]) -> list[int]:
    """Indices of the input files among the assembler arguments ("-" is standard input)."""
    found, skip = [], False
    for n, a in enumerate(args):
        if skip:
            skip = False
        elif a in VALUE_OPTIONS:
            skip = True
        elif a == "-" or not a.startswith("-"):
            found.append(n)
    return found


def temp_file(text: str) -> str:
    """A new file holding text, in $TMPDIR or /tmp like gcc's own temporaries. Not tempfile,
    nor subprocess below: their imports were 8 of the step's 20 ms (`locus cc` compiles a
    small file in ~70 ms, gcc alone in ~14)."""
    d = os.environ.get("TMPDIR") or "/tmp"
    for k in range(100):
        path = os.path.join(d, f"locus-as-{os.getpid()}-{k}.s")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            continue
        except OSError:
            break
        with os.fdopen(fd, "w") as f:
            f.write(text)
        return path
    import tempfile

    fd, path = tempfile.mkstemp(suffix=".s", prefix="locus-as-")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return path


def run(argv: list[str]) -> int:
    """argv's exit status (negative: the signal that ended it), as subprocess.call."""
    pid = os.fork()
    if pid == 0:
        try:
            os.execv(argv[0], argv)
        finally:
            os._exit(127)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: gas.py REAL_AS [as arguments...]", file=sys.stderr)
        return 2
    real, args = argv[0], argv[1:]
    idx = inputs(args)
    if "--32" in args or "--x32" in args:
        os.execv(real, [real, *args])
    tmp: list[str] = []
    done = 0
    try:
        if not idx or any(args[n] == "-" for n in idx):  # gcc -pipe: the code on stdin
            text, n = rewrite(sys.stdin.read())
            path = temp_file(text)
            tmp.append(path)
            args = [a for n, a in enumerate(args) if not (n in idx and a == "-")] + [path]
        else:
            for n in idx:
                try:
                    with open(args[n]) as f:
                        text, count = rewrite(f.read(), done)
                except (OSError, UnicodeDecodeError):
                    continue  # as reports it, or it is not text we rewrite
                done += count
                if count:
                    path = temp_file(text)
                    tmp.append(path)
                    args[n] = path
        if not tmp:
            os.execv(real, [real, *args])
        return run([real, *args])
    finally:
        for path in tmp:
            try:
                os.unlink(path)
            except OSError:
                pass


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
