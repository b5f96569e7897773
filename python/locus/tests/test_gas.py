"""gas.py: the exact backend's hit test written into gcc's (and clang's) assembly."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from locus import gas

ASM = """\
f:
\tmovq\t%rbx, %rdi
\tcall\t*__tsan_write8@GOTPCREL(%rip)
\tmovq\t%r12, (%rbx)
\tcall\t__tsan_read4@PLT
\tcallq\t__tsan_write1
\tcall\t__tsan_volatile_read16@PLT
\tcall\t*__tsan_unaligned_write8@GOTPCREL(%rip)
\tcall\t*__tsan_atomic32_fetch_add@GOTPCREL(%rip)
\tcall\t*__tsan_read_range@GOTPCREL(%rip)
\tcall\t*__tsan_write8_pc@GOTPCREL(%rip)
\tcall\tmy__tsan_write8
\tret
"""


def test_plain_hook_calls_get_the_hit_test_and_keep_the_call():
    out, n = gas.rewrite(ASM)
    assert n == 5  # write8, read4, write1, volatile_read16, unaligned_write8
    lines = out.splitlines()
    # Each rewritten call is still there, once, right after its miss label.
    for call in (
        "\tcall\t*__tsan_write8@GOTPCREL(%rip)",
        "\tcall\t__tsan_read4@PLT",
        "\tcallq\t__tsan_write1",
        "\tcall\t__tsan_volatile_read16@PLT",
        "\tcall\t*__tsan_unaligned_write8@GOTPCREL(%rip)",
    ):
        k = lines.index(call)
        assert lines[k - 1].startswith(".Llocus_miss") and lines[k + 1].startswith(".Llocus_hit")
    assert out.count("locus_xt@GOTTPOFF(%rip)") == 5
    # Access sizes: the last in-line offset (64 - size), and the byte mask of a write.
    assert "$56, %ecx" in out and "$60, %ecx" in out and "$63, %ecx" in out and "$48, %ecx" in out
    assert "$255, %r10" in out and "$1, %r10" in out
    # Reads test the copy set, writes also the writer and the bytes.
    assert out.count("testq\t%r8, %fs:24(%rax)") == 2 and out.count("cmpl\t%fs:40(%rax)") == 3


def test_other_calls_are_left_alone():
    out, _ = gas.rewrite(ASM)
    for kept in ("atomic32_fetch_add", "read_range", "write8_pc", "my__tsan"):
        line = next(x for x in out.splitlines() if kept in x)
        assert line in ASM.splitlines()
    text = "g:\n\tcall\tfoo\n\tret\n"
    assert gas.rewrite(text) == (text, 0)


def test_intel_syntax_is_left_alone():
    text = "\t.intel_syntax noprefix\n" + ASM
    assert gas.rewrite(text) == (text, 0)


def test_labels_are_unique_across_files():
    a, na = gas.rewrite(ASM)
    b, nb = gas.rewrite(ASM, na)
    labels = [x for x in (a + b).splitlines() if x.startswith(".Llocus_")]
    assert len(labels) == 2 * (na + nb) and len(set(labels)) == len(labels)


def test_assembler_inputs():
    assert gas.inputs(["--64", "-o", "x.o", "/tmp/cc.s"]) == [3]
    assert gas.inputs(["-I", "inc", "--defsym", "A=1", "-MD", "d", "-"]) == [6]
    assert gas.inputs(["--gdwarf-5", "--64", "-o", "x.o"]) == []


@pytest.mark.skipif(shutil.which("as") is None, reason="binutils is not installed")
def test_rewritten_code_assembles(tmp_path):
    """The rewrite assembles, through main() (the assembler wrapper's entry), from a file
    and from standard input (gcc -pipe), and the object references the thread state."""
    out, _ = gas.rewrite(ASM)
    src = tmp_path / "a.s"
    src.write_text(ASM)
    real = shutil.which("as")
    assert gas.main([real, "--64", "-o", str(tmp_path / "a.o"), str(src)]) == 0
    objs = [tmp_path / "a.o"]
    p = subprocess.run(
        ["python3", gas.__file__, real, "--64", "-o", str(tmp_path / "b.o")],
        input=ASM,
        text=True,
        capture_output=True,
    )
    assert p.returncode == 0, p.stderr
    objs.append(tmp_path / "b.o")
    for obj in objs:
        nm = subprocess.run(["nm", "-u", str(obj)], capture_output=True, text=True).stdout
        assert "locus_xt" in nm and "__tsan_write8" in nm


def test_verbose_asm_comments_keep_the_hit_test():
    """gcc -fverbose-asm ends the call's line with '# comment': the call was left as it was,
    and the build silently ran a call per access."""
    text = "\tcall\t*__tsan_write8@GOTPCREL(%rip)\t# tmp85,\n"
    out, n = gas.rewrite(text)
    assert n == 1 and "locus_xt@GOTTPOFF" in out


def test_the_assemblers_failure_is_its_own_and_no_temporary_is_left(tmp_path, monkeypatch):
    """The rewritten input goes to a temporary file (in $TMPDIR) that the real assembler
    reads: its exit status is returned (1 for an error, the signal's negative for a kill,
    as subprocess.call did) and the file is gone after either."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    src = tmp_path / "a.s"
    src.write_text(ASM)
    fail = tmp_path / "fail-as"
    fail.write_text('#!/bin/sh\ntest -s "$2" || exit 9\nexit 1\n')
    fail.chmod(0o755)
    killed = tmp_path / "killed-as"
    killed.write_text("#!/bin/sh\nkill -TERM $$\n")
    killed.chmod(0o755)
    assert gas.main([str(fail), "--64", str(src)]) == 1
    assert gas.main([str(killed), "--64", str(src)]) == -15
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.s", "fail-as", "killed-as"]
