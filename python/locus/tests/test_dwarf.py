"""Fields of static variables from DWARF (locus.dwarf): offsets named as the source names
them, in C (structures, arrays of structures, multi-dimensional arrays) and Fortran
(column-major, 1-based, parentheses)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from locus.dwarf import Layout, frame_locals, parse, variable_layout

# llvm-dwarfdump's text for `struct stats { long hits; long misses; int flags[4]; }
# stats[4];` (gcc 12, trimmed to what the walk reads).
C_UNIT = """
0x0000000c: DW_TAG_compile_unit
              DW_AT_language	(DW_LANG_C11)

0x0000005b:   DW_TAG_base_type
                DW_AT_byte_size	(0x08)
                DW_AT_name	("long int")

0x00000062:   DW_TAG_base_type
                DW_AT_byte_size	(0x04)
                DW_AT_name	("int")

0x000000dd:   DW_TAG_structure_type
                DW_AT_name	("stats")
                DW_AT_byte_size	(0x20)

0x000000e8:     DW_TAG_member
                  DW_AT_name	("hits")
                  DW_AT_type	(0x0000005b "long int")
                  DW_AT_data_member_location	(0x00)

0x000000f3:     DW_TAG_member
                  DW_AT_name	("misses")
                  DW_AT_type	(0x0000005b "long int")
                  DW_AT_data_member_location	(0x08)

0x000000fe:     DW_TAG_member
                  DW_AT_name	("flags")
                  DW_AT_type	(0x0000010a "int[4]")
                  DW_AT_data_member_location	(0x10)

0x00000109:     NULL

0x0000010a:   DW_TAG_array_type
                DW_AT_type	(0x00000062 "int")

0x00000113:     DW_TAG_subrange_type
                  DW_AT_upper_bound	(0x03)

0x00000119:     NULL

0x0000011a:   DW_TAG_array_type
                DW_AT_type	(0x000000dd "stats")

0x00000123:     DW_TAG_subrange_type
                  DW_AT_upper_bound	(0x03)

0x00000129:     NULL

0x00000130:   DW_TAG_array_type
                DW_AT_type	(0x00000062 "int")

0x00000139:     DW_TAG_subrange_type
                  DW_AT_upper_bound	(0x01)

0x0000013f:     DW_TAG_subrange_type
                  DW_AT_upper_bound	(0x02)

0x00000145:     NULL

0x00000146:   NULL
"""

# gfortran's `integer(8) :: hits(4)` in module counters: no lower bound (Fortran's is 1).
FORTRAN_UNIT = """
0x0000000c: DW_TAG_compile_unit
              DW_AT_language	(DW_LANG_Fortran95)

0x0000002b:   DW_TAG_array_type
                DW_AT_type	(0x0000003b "integer(kind=8)")

0x00000034:     DW_TAG_subrange_type
                  DW_AT_upper_bound	(4)

0x0000003a:     NULL

0x0000003b:   DW_TAG_base_type
                DW_AT_byte_size	(0x08)
                DW_AT_name	("integer(kind=8)")

0x00000042:   NULL
"""


def test_c_fields():
    dies = parse(C_UNIT)
    assert [c.tag for c in dies[0xDD].children] == ["DW_TAG_member"] * 3
    stats = Layout("stats", "stats[4]", None, False, dies, 0x11A)
    assert [stats.field(o) for o in (0, 7, 8, 16, 20, 40, 124)] == [
        "stats[0].hits",
        "stats[0].hits",
        "stats[0].misses",
        "stats[0].flags[0]",
        "stats[0].flags[1]",
        "stats[1].misses",
        "stats[3].flags[3]",
    ]
    assert stats.field(128) == "stats"  # past the end: the variable only
    grid = Layout("grid", "int[2][3]", None, False, dies, 0x130)
    assert [grid.field(o) for o in (0, 4, 12, 20)] == [
        "grid[0][0]",
        "grid[0][1]",
        "grid[1][0]",
        "grid[1][2]",
    ]  # row-major


def test_array_element_types():
    """What padding separates in an array of structures: its element type, as the source
    names it (C's `struct stats`, C++'s `stats`, with its size); nothing for an array of
    scalars or a single structure, whose fields are what to pad."""
    dies = parse(C_UNIT)
    assert Layout("stats", "stats[4]", None, False, dies, 0x11A).element() == ("struct stats", 32)
    assert Layout("grid", "int[2][3]", None, False, dies, 0x130).element() is None
    assert Layout("one", "stats", None, False, dies, 0xDD).element() is None
    cxx = parse(C_UNIT.replace("DW_LANG_C11", "DW_LANG_C_plus_plus_14"))
    assert Layout("stats", "stats[4]", None, False, cxx, 0x11A).element() == ("stats", 32)


ELEMENTS_SRC = """struct stats { long hits; long misses; };
typedef struct { long n; } slot_t;
struct stats counters[4];
slot_t slots[4];
const volatile struct stats fixed[2] = {{1, 2}, {3, 4}};
long plain[4];
struct stats single;
int main(void) {
  return (int)(counters[1].hits + slots[2].n + fixed[1].misses + plain[3] + single.hits);
}
"""


@pytest.mark.skipif(not shutil.which("llvm-dwarfdump"), reason="llvm-dwarfdump")
@pytest.mark.parametrize("compiler", ["cc", "c++", "clang"])
def test_array_element_types_from_a_build(tmp_path, compiler):
    if not shutil.which(compiler):
        pytest.skip(f"{compiler} is not installed")
    src = tmp_path / ("a.cc" if compiler == "c++" else "a.c")
    src.write_text(ELEMENTS_SRC)
    exe = tmp_path / "app"
    subprocess.run([compiler, "-g", "-O0", "-o", str(exe), str(src)], check=True)
    syms = subprocess.run(
        ["nm", "--defined-only", str(exe)], capture_output=True, text=True, check=True
    ).stdout
    addr = {ln.split()[-1]: int(ln.split()[0], 16) for ln in syms.splitlines()}
    got = {}
    for name in ("counters", "slots", "fixed", "plain", "single"):
        layout = variable_layout(str(exe), name, addr[name])
        assert layout is not None, name
        got[name] = layout.element()
    stats = "stats" if compiler == "c++" else "struct stats"
    assert got == {
        "counters": (stats, 16),
        "slots": ("slot_t", 8),
        "fixed": (stats, 16),
        "plain": None,
        "single": None,
    }


def test_fortran_fields():
    dies = parse(FORTRAN_UNIT)
    hits = Layout("counters::hits", "integer(kind=8)[]", None, True, dies, 0x2B)
    assert [hits.field(o) for o in (0, 8, 24, 32)] == [
        "counters::hits(1)",
        "counters::hits(2)",
        "counters::hits(4)",
        "counters::hits",
    ]


@pytest.mark.skipif(not shutil.which("llvm-dwarfdump"), reason="llvm-dwarfdump")
@pytest.mark.parametrize("compiler", ["cc", "clang"])
def test_variable_layout_from_a_build(tmp_path, compiler):
    """From a real build: the variable is found by name and address (two `slot` statics
    of two files are told apart), its unit read, its type followed. clang writes DWARF 5
    with DW_OP_addrx (an index into each unit's .debug_addr table), where every field name
    was missing; b.c's unit has a second table, with other variables before `slot`."""
    if not shutil.which(compiler):
        pytest.skip(f"{compiler} is not installed")
    (tmp_path / "a.c").write_text(
        "struct pair { int a; int b; } slot[2];\nint main(void) { return slot[1].b; }\n"
    )
    (tmp_path / "b.c").write_text(
        "long x1, x2;\nstatic long slot[3];\nlong *other(void) { return x1 + x2 + slot; }\n"
    )
    exe = tmp_path / "app"
    subprocess.run(
        [compiler, "-g", "-O0", "-o", str(exe), str(tmp_path / "a.c"), str(tmp_path / "b.c")],
        check=True,
    )
    syms = subprocess.run(["nm", str(exe)], capture_output=True, text=True, check=True).stdout
    addrs = [int(ln.split()[0], 16) for ln in syms.splitlines() if ln.endswith(" slot")]
    assert len(addrs) == 2
    got = {}
    for a in addrs:
        layout = variable_layout(str(exe), "slot", a)
        assert layout is not None
        got[layout.size] = [layout.field(o) for o in (0, 4, 8, 12)]
        got[layout.size, "decl"] = layout.decl
    assert got[16] == ["slot[0].a", "slot[0].b", "slot[1].a", "slot[1].b"]
    assert got[24] == ["slot[0]", "slot[0]", "slot[1]", "slot[1]"]
    # Where each is declared (the advice says it: "`slot` (declared at b.c:2)").
    assert (got[16, "decl"], got[24, "decl"]) == ("a.c:1", "b.c:2")
    assert variable_layout(str(exe), "slot", 0x1) is None  # no variable there


@pytest.mark.skipif(not shutil.which("llvm-dwarfdump"), reason="llvm-dwarfdump")
@pytest.mark.parametrize("lang", ["c++", "rust", "tls"])
def test_library_members_the_source_never_names_are_passed_over(tmp_path, lang):
    """libstdc++'s std::array holds its elements in `_M_elems`, Rust's Cell in `value`: the
    fields read as the source writes them (`counters[1]`, `c.b`), and a std::array of
    structures pads its element type as a C array does. A thread-local variable is found by
    its offset in the module's TLS block (DW_OP_form_tls_address)."""
    if lang == "c++":
        (tmp_path / "a.cpp").write_text(
            "#include <array>\n#include <atomic>\n"
            "std::array<std::atomic<long>, 2> counters;\n"
            "int main() { return counters[1].load(); }\n"
        )
        cmd = ["g++", "-g", "-O0", "-o", str(tmp_path / "app"), str(tmp_path / "a.cpp")]
        name, want = "counters", ["counters[0]", "counters[1]"]
    elif lang == "rust":
        if not shutil.which("rustc"):
            pytest.skip("rustc is not installed")
        (tmp_path / "a.rs").write_text(
            "use std::cell::Cell;\npub struct Two { pub a: Cell<i64>, pub b: Cell<i64> }\n"
            "unsafe impl Sync for Two {}\n#[no_mangle]\n"
            "pub static TWO: Two = Two { a: Cell::new(1), b: Cell::new(2) };\n"
            'fn main() { println!("{}", TWO.b.get()); }\n'
        )
        cmd = ["rustc", "-g", "-o", str(tmp_path / "app"), str(tmp_path / "a.rs")]
        name, want = "TWO", ["TWO.a", "TWO.b"]
    else:
        (tmp_path / "a.c").write_text(
            "struct pair { long a; long b; };\n__thread long first;\n__thread struct pair tp;\n"
            "int main(void) { return (int)(first + tp.b); }\n"
        )
        cmd = ["cc", "-g", "-O0", "-o", str(tmp_path / "app"), str(tmp_path / "a.c")]
        name, want = "tp", ["tp.a", "tp.b"]
    subprocess.run(cmd, check=True)
    syms = subprocess.run(
        ["readelf", "-sW", str(tmp_path / "app")], capture_output=True, text=True, check=True
    ).stdout
    at = next(int(f[1], 16) for f in map(str.split, syms.splitlines()) if f[-1:] == [name])
    layout = variable_layout(str(tmp_path / "app"), name, at, lang == "tls")
    assert layout is not None
    assert [layout.field(o) for o in (0, 8)] == want
    if lang == "c++":
        assert layout.element() == ("atomic<long int>", 8)
    if lang == "tls":  # (the other variable's offset is not this one's)
        assert variable_layout(str(tmp_path / "app"), name, at + 8, True) is None


def test_location_lists_are_read_at_the_call():
    """A location list (llvm-dwarfdump prints one entry a line after the attribute's
    opening): its entry that holds an address, the closing parenthesis left out."""
    from locus.dwarf import _location_at, parse

    text = (
        "0x00000043:     DW_TAG_variable\n"
        "                  DW_AT_location\t(indexed (0x1) loclist = 0x00000057: \n"
        "                     [0x0000000000001274, 0x00000000000012fa): DW_OP_breg7 RSP+16\n"
        "                     [0x00000000000012fa, 0x0000000000001300): DW_OP_entry_value"
        "(DW_OP_reg1 RDX), DW_OP_stack_value)\n"
        '                  DW_AT_name\t("hist")\n'
    )
    (d,) = parse(text).values()
    assert d.attrs["DW_AT_name"] == '"hist"'
    loc = d.attrs["DW_AT_location"]
    assert _location_at(loc, 0x12DC) == "DW_OP_breg7 RSP+16"
    assert _location_at(loc, 0x12FB) == "DW_OP_entry_value(DW_OP_reg1 RDX), DW_OP_stack_value"
    assert _location_at(loc, 0x1300) == ""
    assert _location_at("DW_OP_fbreg -24", 0x1) == "DW_OP_fbreg -24"


def test_member_offsets_in_older_dwarf_and_bit_fields():
    from locus.dwarf import _member_offset

    dies = parse(
        """
0x00000010:   DW_TAG_member
                DW_AT_name	("b")
                DW_AT_data_member_location	(DW_OP_plus_uconst 0xc)

0x00000020:   DW_TAG_member
                DW_AT_name	("flag")
                DW_AT_data_bit_offset	(0x23)
"""
    )
    assert _member_offset(dies[0x10]) == 12
    assert _member_offset(dies[0x20]) == 4


@pytest.mark.skipif(not shutil.which("llvm-dwarfdump") or not shutil.which("cc"), reason="tools")
@pytest.mark.parametrize("debug", ["-g", "-gdwarf-4"])  # DWARF 4: DW_AT_bit_offset
def test_bit_fields_and_unions_from_a_build(tmp_path, debug):
    """A bit field was sized by its type (`unsigned c:24` at bit 8 covered bytes 1-4, so
    byte 4, `d`, read `c`), and a union named every byte by its first member (`un.l` for
    both threads' `un.i[0]`, `un.i[1]`)."""
    (tmp_path / "a.c").write_text(
        "struct bf { unsigned a : 4; unsigned b : 4; unsigned c : 24; int d; } bits;\n"
        "union { long l; int i[2]; } un;\n"
        "int main(void) { return bits.d + un.i[1]; }\n"
    )
    exe = tmp_path / "app"
    subprocess.run(["cc", debug, "-O0", "-o", str(exe), str(tmp_path / "a.c")], check=True)
    syms = subprocess.run(["nm", str(exe)], capture_output=True, text=True, check=True).stdout
    addr = {
        ln.split()[2]: int(ln.split()[0], 16) for ln in syms.splitlines() if len(ln.split()) == 3
    }
    bits = variable_layout(str(exe), "bits", addr["bits"])
    assert [bits.field(o) for o in range(8)] == ["bits.a"] + ["bits.c"] * 3 + ["bits.d"] * 4
    un = variable_layout(str(exe), "un", addr["un"])
    assert [un.field(o) for o in (0, 3, 4, 7)] == ["un.i[0]", "un.i[0]", "un.i[1]", "un.i[1]"]


@pytest.mark.skipif(
    not shutil.which("llvm-dwarfdump") or not shutil.which("gfortran"), reason="tools"
)
def test_fortran_common_block_members(tmp_path):
    """A COMMON block is the symbol `cblock_`, which no DWARF variable is named: its
    members had no field names, and the advice told to declare `cblock_(8, nthreads)`."""
    (tmp_path / "c.f90").write_text(
        "program main\n  integer(8) :: cblk(4), other\n  common /cblock/ cblk, other\n"
        "  cblk = 1\n  other = 2\n  print *, cblk(2) + other\nend program main\n"
    )
    exe = tmp_path / "app"
    subprocess.run(["gfortran", "-g", "-O0", "-o", str(exe), str(tmp_path / "c.f90")], check=True)
    syms = subprocess.run(["nm", str(exe)], capture_output=True, text=True, check=True).stdout
    (addr,) = [int(ln.split()[0], 16) for ln in syms.splitlines() if ln.endswith(" cblock_")]
    layout = variable_layout(str(exe), "cblock_", addr)
    assert layout is not None and layout.type == "COMMON /cblock/" and layout.size == 40
    assert [layout.field(o) for o in (0, 8, 31, 32)] == ["cblk(1)", "cblk(2)", "cblk(4)", "other"]


# -gsplit-dwarf: the program holds skeleton units only, the functions and variables are in
# .dwo files, their addresses indices into the program's .debug_addr (DWARF 5's tables,
# GNU's DWARF 4 list), their blocks' ranges in the .dwo's range lists (DWARF 5) or the
# program's (DWARF 4). "dwp": the .dwo files packed into PROGRAM.dwp by llvm-dwp, and gone.
DEBUG_BUILDS = {
    "": (),
    "split": ("-gsplit-dwarf",),
    "split4": ("-gsplit-dwarf", "-gdwarf-4"),
    "dwp": ("-gsplit-dwarf",),
    "dwp4": ("-gsplit-dwarf", "-gdwarf-4"),
}


# A unit built before the tested one in the "dwp" builds: the tested unit is then the
# package's second, its sections' parts past the first's (and a static of the same name).
FIRST_UNIT = (
    "struct other { char c[40]; };\n"
    "static struct other pad[3];\n"
    "long first_unit(long i) { return pad[i % 3].c[i % 40] += (char)i; }\n"
)


def _first_unit(tmp_path, debug: str) -> list[str]:
    """The sources to build before the tested one: FIRST_UNIT in the "dwp" builds."""
    if not debug.startswith("dwp"):
        return []
    (tmp_path / "first.c").write_text(FIRST_UNIT)
    return [str(tmp_path / "first.c")]


def _packed(exe, debug: str) -> None:
    """For the "dwp" builds: the program's .dwo files packed into EXE.dwp, then removed."""
    if not debug.startswith("dwp"):
        return
    if not shutil.which("llvm-dwp"):
        pytest.skip("llvm-dwp is not installed")
    try:
        subprocess.run(["llvm-dwp", "-e", str(exe), "-o", f"{exe}.dwp"], check=True, timeout=30)
    except subprocess.TimeoutExpired:
        # (llvm-dwp 14 loops on gcc 12's DWARF 5 .dwo files of some units, binutils' dwp
        # crashes on them: no tool here packs them)
        pytest.skip("llvm-dwp did not finish packing this build's .dwo files")
    for dwo in exe.parent.glob("*.dwo"):
        dwo.unlink()


FRAME_SRC = r"""
#include <stdio.h>
struct slot { long count; long spare; };
/* What the runtime records at a call (LOCUS_CALLER_FRAME): the caller's stack pointer at
 * the call (the callee's CFA), its frame pointer, the return address; and the local. */
__attribute__((noinline)) void probe(void *p) {
  void **fp = __builtin_frame_address(0);
  printf("%lx %lx %lx %lx\n", (unsigned long)__builtin_dwarf_cfa(), (unsigned long)fp[0],
         (unsigned long)__builtin_return_address(0), (unsigned long)p);
  fflush(stdout);
}
static inline __attribute__((always_inline)) long run(void) {
  struct slot inner[2] = {{1, 2}, {3, 4}};
  probe(inner);
  return inner[1].count;
}
/* A local aligned past the stack's 16 bytes: the function realigns its frame (gcc through
 * a register holding the CFA, its locals then relative to the frame pointer). */
__attribute__((noinline)) long realigned(void) {
  _Alignas(64) long grid[2] = {5, 6};
  probe(grid);
  return grid[1];
}
int main(void) {
  struct slot slots[4] = {{0}};
  probe(slots);
  long r = run(); /* (in this order: the probes' lines are read in it) */
  long g = realigned();
  return (int)(slots[1].count + r + g);
}
"""


@pytest.mark.skipif(not shutil.which("llvm-dwarfdump"), reason="llvm-dwarfdump")
@pytest.mark.parametrize("compiler", ["gcc", "clang"])
@pytest.mark.parametrize("opt", ["-O0", "-O2", "-O2 split", "-O2 split4", "-O2 dwp", "-O2 dwp4"])
def test_frame_locals_from_a_build(tmp_path, compiler, opt):
    """The locals of the frame that made a call, from the call's return address and the
    stack and frame pointers the runtime records there: a local of main (gcc's frame base
    is the CFA, from the call's row of .eh_frame; clang's the frame or stack pointer), and
    one of a function inlined into main, which the lookup of the address does not show
    inside main. The same in split-DWARF builds (DEBUG_BUILDS)."""
    if not shutil.which(compiler):
        pytest.skip(f"{compiler} is not installed")
    (tmp_path / "f.c").write_text(FRAME_SRC)
    exe = tmp_path / "f"
    opt, _, debug = opt.partition(" ")
    first = _first_unit(tmp_path, debug)
    subprocess.run(
        [compiler, "-g", *DEBUG_BUILDS[debug], opt, "-no-pie", "-fno-pie", "-o", str(exe)]
        + [*first, "f.c"],
        check=True,
        cwd=tmp_path,
    )
    _packed(exe, debug)
    out = subprocess.run([str(exe)], capture_output=True, text=True).stdout.split("\n")
    (cfa, fp, ret, slots), (cfa2, fp2, ret2, inner), (cfa3, fp3, ret3, grid) = [
        [int(x, 16) for x in ln.split()] for ln in out[:3]
    ]
    found = {v.name: v for v in frame_locals(str(exe), ret, cfa, fp)}
    v = found["slots"]
    assert (v.lo, v.size, v.function, v.decl) == (slots, 64, "main", "f.c:25")
    assert v.layout.field(24) == "slots[1].spare"
    assert v.layout.element() == ("struct slot", 16)
    found = {v.name: v for v in frame_locals(str(exe), ret2, cfa2, fp2)}
    v = found["inner"]
    assert (v.lo, v.size, v.function) == (inner, 32, "run (inlined into main)")
    v = {v.name: v for v in frame_locals(str(exe), ret3, cfa3, fp3)}["grid"]
    assert (v.lo, v.size, v.function) == (grid, 16, "realigned")
    assert frame_locals(str(exe), 0x10, cfa, fp) == []  # no function there


def test_stack_layout_names_locals_and_leaves_out_clashes():
    """A stack object's offsets read as the locals recorded frames hold; two frames whose
    locals share bytes (a stack reused by later calls) name neither there."""
    from locus.dwarf import Local, StackLayout

    dies = parse(C_UNIT)
    stats = Layout("stats", "stats[4]", 128, False, dies, 0x11A)
    grid = Layout("grid", "int[2][3]", 24, False, dies, 0x130)
    base = 0x7000
    stack = StackLayout(
        "stack of thread 0",
        base,
        [
            Local("stats", "main", "a.c:3", base + 0x100, 128, stats),
            Local("stats", "main", "a.c:3", base + 0x100, 128, stats),  # a second record
            Local("grid", "work", "a.c:9", base + 0x400, 24, grid),
            Local("other", "later", "a.c:20", base + 0x410, 8, grid),
            Local("big", "f", "a.c:30", base + 0x600, 64, grid),  # holds the next two
            Local("inner", "g", "a.c:31", base + 0x610, 8, grid),
            Local("inner2", "g", "a.c:32", base + 0x620, 8, grid),
            Local("after", "g", "a.c:33", base + 0x700, 8, grid),
        ],
    )
    assert [v.name for v in stack.locals] == ["stats", "after"]
    assert stack.local(0x704).name == "after" and stack.local(0x708) is None
    assert stack.field(0x100 + 40) == "stats[1].misses"
    assert stack.field(0x90) == "stack of thread 0"  # between locals
    assert stack.field(0x404) == "stack of thread 0"  # the clash
    assert stack.local(0x90) is None and stack.element() is None
    assert stack.at(0x404, [5]) == [] and not stack.timed  # no times: no telling


def test_stack_layout_tells_clashing_locals_apart_by_time():
    """Locals of two frames at the same bytes, recorded at known times (a function with a
    parallel region, then another, then the first again): an access is the local of the
    frame recorded last before it; before the first record, none."""
    from locus.dwarf import Local, StackLayout

    dies = parse(C_UNIT)
    grid = Layout("grid", "int[2][3]", 24, False, dies, 0x130)
    base = 0x7000
    a = Local("alpha", "phase_a", "p.c:4", base + 0x400, 24, grid)
    b = Local("beta", "phase_b", "p.c:9", base + 0x408, 8, grid)
    keep = Local("kept", "main", "p.c:1", base + 0x500, 8, grid)
    stack = StackLayout("stack of thread 0", base, [a, b, a, keep], [100, 200, 300, 100])
    assert [v.name for v in stack.locals] == ["kept"] and len(stack.timed) == 3
    assert stack.local(0x408) is None
    assert [v.name for v in stack.at(0x408, [150])] == ["alpha"]
    assert [v.name for v in stack.at(0x408, [250, 260])] == ["beta"]
    assert [v.name for v in stack.at(0x408, [310, 150])] == ["alpha"]
    assert {v.name for v in stack.at(0x408, [150, 250])} == {"alpha", "beta"}
    assert stack.at(0x400, [250]) == []  # beta's frame does not cover it: alpha's is gone
    assert stack.at(0x408, [50]) == []
    assert [v.name for v in stack.at(0x500, [50])] == ["kept"]
    # With the accessing function: phase_a's own code (its prologue zeroing alpha before its
    # call was recorded) or its OpenMP region's is alpha's whatever the time (a writer's
    # bytes reported at the time its store was detected); other code goes by the time.
    assert [v.name for v in stack.at(0x408, [(250, "phase_a._omp_fn.0")])] == ["alpha"]
    assert [v.name for v in stack.at(0x408, [(290, "phase_a")])] == ["alpha"]
    assert [v.name for v in stack.at(0x408, [(50, "phase_a")])] == ["alpha"]
    assert [v.name for v in stack.at(0x408, [(150, "phase_b")])] == ["beta"]
    assert [v.name for v in stack.at(0x408, [(250, "worker"), (250, "")])] == ["beta"]
    assert [v.name for v in stack.at(0x408, [(250, ".omp_outlined.")])] == ["beta"]


HEAP_SRC = r"""#include <stdlib.h>
struct stats { long hits; long misses; };
typedef struct stats stats_t;
struct stats *keep[4];
__attribute__((noinline)) void own(void) {
  struct stats *st = calloc(4, sizeof *st);
  keep[0] = st;
}
__attribute__((noinline)) void assigned(void) {
  struct stats *later;
  later = malloc(4 * sizeof *later);
  keep[1] = later;
}
__attribute__((noinline)) void untyped(void) {
  void *raw = malloc(64);
  keep[2] = raw;
}
__attribute__((noinline)) void through_typedef(void) {
  stats_t *td = malloc(2 * sizeof *td);
  keep[3] = td;
}
struct stats *gp;
struct holder { struct stats *p; } hold;
__attribute__((noinline)) void global_one(void) {
  gp = malloc(sizeof *gp);
}
__attribute__((noinline)) void member(void) {
  hold.p = malloc(sizeof *hold.p);
}
__attribute__((noinline)) void element(void) {
  for (int i = 2; i < 4; i++) keep[i] = malloc(sizeof *keep[i]);
}
__attribute__((noinline)) void through_pointer(struct holder *h) {
  h->p = calloc(2, sizeof *h->p);
}
int main(void) {
  own(); assigned(); untyped(); through_typedef(); global_one(); member(); element();
  through_pointer(&hold);
  return 0;
}
"""


def _allocating_calls(
    tmp_path, compiler: str, name: str, src: str, opt: str, calls: tuple, debug: str = ""
):
    """`src` built at fixed addresses (with DEBUG_BUILDS[debug] too), and the return address
    of each function's first call whose text holds one of `calls` (the instruction after
    it): {function: address}."""
    if not shutil.which(compiler):
        pytest.skip(f"{compiler} is not installed")
    (tmp_path / name).write_text(src)
    exe = tmp_path / name.split(".")[0]
    subprocess.run(
        [compiler, "-g", *DEBUG_BUILDS[debug], opt, "-no-pie", "-fno-pie", "-o", str(exe)]
        + [*_first_unit(tmp_path, debug), str(tmp_path / name)],
        check=True,
        cwd=tmp_path,  # (where -gsplit-dwarf writes its .dwo files)
    )
    if debug:
        assert list(tmp_path.glob("*.dwo")), list(tmp_path.iterdir())
    _packed(exe, debug)
    dis = subprocess.run(
        ["objdump", "-d", "--no-show-raw-insn", "-C", str(exe)], capture_output=True, text=True
    ).stdout.splitlines()
    ret: dict[str, int] = {}
    fn = None
    for k, ln in enumerate(dis):
        if ln.endswith(">:"):
            fn = ln.split("<")[1].rstrip(">:")
        elif "call" in ln and any(c in ln for c in calls) and fn not in ret:
            ret[fn] = int(dis[k + 1].split(":")[0], 16)
    return exe, ret


@pytest.mark.skipif(not shutil.which("llvm-dwarfdump"), reason="llvm-dwarfdump")
@pytest.mark.parametrize(
    "compiler,debug",
    # (not gcc's DWARF 5 package: Debian 12's llvm-dwp 14 loops on these gcc 12 .dwo files,
    # binutils' dwp crashes on them)
    [(c, d) for c in ("gcc", "clang") for d in DEBUG_BUILDS if d and (c, d) != ("gcc", "dwp")],
)
def test_statics_of_one_name_in_two_split_units(tmp_path, compiler, debug):
    """Two units' statics of one name (`pad`), each found in its own unit: in a package, a
    unit's address indices are its own, so a variable found in another unit is not taken
    for the skeleton's (its index would read the skeleton's table). The package's units
    were not read at all before (no .dwo files): no layout."""
    if not shutil.which(compiler):
        pytest.skip(f"{compiler} is not installed")
    (tmp_path / "first.c").write_text(FIRST_UNIT)
    (tmp_path / "s.c").write_text(
        "struct stats { long hits, misses; };\nstatic struct stats pad[2];\n"
        "long first_unit(long);\n"
        "int main(int c, char **v) { pad[c & 1].misses += c; (void)v;\n"
        "  return (int)(pad[1].misses + first_unit(c)); }\n"
    )
    exe = tmp_path / "s"
    subprocess.run(
        [compiler, "-g", "-O1", *DEBUG_BUILDS[debug], "-o", str(exe), "first.c", "s.c"],
        check=True,
        cwd=tmp_path,
    )
    _packed(exe, debug)
    syms = subprocess.run(["nm", str(exe)], capture_output=True, text=True, check=True).stdout
    pads = [int(f[0], 16) for f in map(str.split, syms.splitlines()) if f[1:] == ["b", "pad"]]
    assert len(pads) == 2, syms
    found = {}
    for at in pads:
        lay = variable_layout(str(exe), "pad", at)
        assert lay is not None, (debug, hex(at))
        found[lay.type] = (lay.size, lay.field(24), lay.decl)
    assert found == {
        "other[3]": (120, "pad[0].c[24]", "first.c:2"),
        "stats[2]": (32, "pad[1].misses", "s.c:2"),
    }


@pytest.mark.skipif(not shutil.which("llvm-dwarfdump"), reason="llvm-dwarfdump")
@pytest.mark.parametrize("compiler", ["gcc", "clang"])
@pytest.mark.parametrize("debug", list(DEBUG_BUILDS))
def test_heap_layout_from_the_pointer_the_allocating_line_declares(tmp_path, compiler, debug):
    """A heap block is read as an array of what the pointer declared on its allocating
    line points to (`st[1].misses`), or, declaring none, the one pointer variable it
    assigns (a local declared before, a global; a block of one: `gp->misses`), or the
    member (`hold.p`, `h->p`) or element (`keep[i]` in a loop); a pointer to void names
    nothing. The same in split-DWARF builds."""
    from locus.dwarf import heap_layout

    exe, ret = _allocating_calls(tmp_path, compiler, "h.c", HEAP_SRC, "-O1", ("alloc@plt>",), debug)
    own = heap_layout(str(exe), ret["own"], 6, 64)
    assert own is not None and (own.name, own.size) == ("st", 64)
    assert [own.field(x) for x in (0, 24, 56)] == ["st[0].hits", "st[1].misses", "st[3].misses"]
    assert own.element() == ("struct stats", 16)
    later = heap_layout(str(exe), ret["assigned"], 11, 64)
    assert later is not None and later.field(24) == "later[1].misses"
    assert later.element() == ("struct stats", 16)
    one = heap_layout(str(exe), ret["global_one"], 25, 16)
    assert one is not None and [one.field(x) for x in (0, 8)] == ["gp->hits", "gp->misses"]
    member = heap_layout(str(exe), ret["member"], 28, 16)
    assert member is not None and member.field(8) == "hold.p->misses"
    arrow = heap_layout(str(exe), ret["through_pointer"], 34, 32)
    assert arrow is not None and arrow.field(24) == "h->p[1].misses"
    each = heap_layout(str(exe), ret["element"], 31, 16)
    assert each is not None and each.field(8) == "keep[i]->misses"
    assert heap_layout(str(exe), ret["untyped"], 15, 64) is None
    assert heap_layout(str(exe), ret["untyped"], 15, 64) is None
    td = heap_layout(str(exe), ret["through_typedef"], 19, 32)
    assert td is not None and td.field(16) == "td[1].hits"
    assert td.element() == ("stats_t", 16)
    assert heap_layout(str(exe), ret["own"], 7, 64) is None  # another line


MEMBER_SRC = r"""struct Counter { long n; long m; };
struct Pool {
  Counter *counts;
  Counter *spare;
  __attribute__((noinline)) void make(int k);
  __attribute__((noinline)) void again(int k);
};
void Pool::make(int k) { counts = new Counter[k](); }
void Pool::again(int k) { this->spare = new Counter[k](); }
Pool *keep;
int main() {
  static Pool p;
  p.make(4);
  p.again(2);
  keep = &p;
  return (int)p.counts[1].m;
}
"""


@pytest.mark.skipif(not shutil.which("llvm-dwarfdump"), reason="llvm-dwarfdump")
@pytest.mark.parametrize("compiler", ["g++", "clang++"])
def test_heap_layout_of_a_member_a_method_assigns(tmp_path, compiler):
    """`counts = new Counter[k]();` in a member function: the block is named by the member
    (this->counts), written with `this->` or without."""
    from locus.dwarf import heap_layout

    exe, rets = _allocating_calls(tmp_path, compiler, "m.cc", MEMBER_SRC, "-O1", ("operator new",))
    make = next((a for f, a in rets.items() if "make" in f), None)
    again = next((a for f, a in rets.items() if "again" in f), None)
    assert make and again, rets
    counts = heap_layout(str(exe), make, 8, 64)
    assert counts is not None and counts.field(24) == "counts[1].m"
    assert counts.element() == ("Counter", 16)
    spare = heap_layout(str(exe), again, 9, 32)
    assert spare is not None and spare.field(16) == "this->spare[1].n"


VECTOR_SRC = r"""#include <vector>
struct Counter { long n; long m; };
std::vector<Counter> *keep;
int main() {
  std::vector<Counter> counts(4);
  keep = &counts;
  return (int)counts[1].m;
}
"""


@pytest.mark.skipif(not shutil.which("llvm-dwarfdump"), reason="llvm-dwarfdump")
@pytest.mark.parametrize("compiler", ["g++", "clang++"])
def test_heap_layout_of_a_vector_constructed_on_its_line(tmp_path, compiler):
    """`std::vector<Counter> counts(4);`: the block its constructor allocates (operator new,
    inlined into main) is an array of its template argument, named after the vector."""
    from locus.dwarf import heap_layout

    exe, rets = _allocating_calls(tmp_path, compiler, "v.cc", VECTOR_SRC, "-O2", ("operator new",))
    ret = rets.get("main")
    assert ret is not None, "no operator new call in main"
    v = heap_layout(str(exe), ret, 5, 64)
    assert v is not None and v.name == "counts"
    assert [v.field(x) for x in (0, 24)] == ["counts[0].n", "counts[1].m"]
    assert v.element() == ("Counter", 16)
    one = heap_layout(str(exe), ret, 5, 16)  # (a vector of one is still indexed)
    assert one is not None and one.field(8) == "counts[0].m"


def test_frame_base_expressions(monkeypatch):
    """DW_AT_frame_base: a register, a register plus an offset, the CFA, and the CFA with an
    offset added (rustc's and LLVM's realigned frames: its locals were not named)."""
    from locus import dwarf

    monkeypatch.setattr(dwarf, "_cfa_rule", lambda path, pc: ("RSP", 192))
    regs = {"6": 0x9000, "7": 0x8000}
    assert dwarf._frame_base("DW_OP_reg7 RSP", "m", 1, regs) == 0x8000
    assert dwarf._frame_base("DW_OP_breg6 RBP+16", "m", 1, regs) == 0x9010
    assert dwarf._frame_base("DW_OP_call_frame_cfa", "m", 1, regs) == 0x8000 + 192
    cfa_less = "DW_OP_call_frame_cfa, DW_OP_consts -176, DW_OP_plus"
    assert dwarf._frame_base(cfa_less, "m", 1, regs) == 0x8000 + 16
    assert dwarf._frame_base("DW_OP_call_frame_cfa, DW_OP_plus_uconst 8", "m", 1, regs) == 0x80C8
    assert dwarf._frame_base("DW_OP_reg3 RBX", "m", 1, regs) is None
    assert dwarf._frame_base("", "m", 1, regs) is None
    monkeypatch.setattr(dwarf, "_cfa_rule", lambda path, pc: None)
    assert dwarf._frame_base(cfa_less, "m", 1, regs) is None


def test_the_cfa_after_an_early_epilogue_is_the_bodys():
    """gcc -O2's main with its epilogue in the middle (remember_state ... restore_state):
    llvm-dwarfdump 14's own row table reads CFA=RSP+8 for the code after the epilogue, 40
    bytes off; the instructions, run from the CIE's, give RSP+48 there."""
    from locus import dwarf

    cie = ["DW_CFA_def_cfa: RSP +8", "DW_CFA_offset: RIP -8", "DW_CFA_undefined: RIP"]
    fde = [
        "DW_CFA_advance_loc: 1", "DW_CFA_def_cfa_offset: +16", "DW_CFA_offset: RBP -16",
        "DW_CFA_advance_loc: 8", "DW_CFA_def_cfa_offset: +24", "DW_CFA_offset: RBX -24",
        "DW_CFA_advance_loc: 4", "DW_CFA_def_cfa_offset: +48", "DW_CFA_advance_loc1: 76",
        "DW_CFA_remember_state:", "DW_CFA_def_cfa_offset: +24", "DW_CFA_advance_loc: 3",
        "DW_CFA_def_cfa_offset: +16", "DW_CFA_advance_loc: 1", "DW_CFA_def_cfa_offset: +8",
        "DW_CFA_advance_loc: 1", "DW_CFA_restore_state:", "DW_CFA_nop:",
    ]  # fmt: skip
    rows = dwarf._cfa_rows(0x1080, cie, fde)
    assert rows == [
        (0x1080, "RSP", 8), (0x1081, "RSP", 16), (0x1089, "RSP", 24), (0x108D, "RSP", 48),
        (0x10D9, "RSP", 24), (0x10DC, "RSP", 16), (0x10DD, "RSP", 8), (0x10DE, "RSP", 48),
    ]  # fmt: skip
    # A frame kept in rbp, an expression, and an instruction that changes the CFA unknown.
    assert dwarf._cfa_rows(0, cie, ["DW_CFA_advance_loc: 4", "DW_CFA_def_cfa_register: RBP"]) == [
        (0, "RSP", 8),
        (4, "RBP", 8),
    ]
    assert dwarf._cfa_rows(0, cie, ["DW_CFA_def_cfa_expression: DW_OP_breg7 RSP+8"]) == [
        (0, None, 0)
    ]
    assert dwarf._cfa_rows(0, cie, ["DW_CFA_restore_state:"]) == []
