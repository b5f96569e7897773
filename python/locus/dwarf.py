"""The fields of a global variable, from the module's DWARF (llvm-dwarfdump): an offset in
`stats` is `stats[1].misses`, so that false-sharing advice names the fields threads share,
not only their offsets.

    layout = variable_layout("/path/app", "stats", 0x40a0)
    layout.field(40)  ->  "stats[1].misses"

The variable is found by name (`--name`, its DW_AT_name: the last `::` part of a C++ or
Fortran name) and address (its DW_OP_addr, the ELF virtual address), then its compile unit
is read whole (`--debug-info=CU --show-children`) and its type followed: typedefs and
qualifiers, structures and unions (DW_AT_data_member_location), arrays (every subrange; C
row-major, Fortran column-major from DW_AT_ordering, with its lower bounds; Fortran indices
in parentheses). Anything else (no debug information, a type the walk does not know, a
location that is neither a plain address nor DWARF 5's DW_OP_addrx, an index into the
unit's .debug_addr table) gives None, or the deepest name known."""

from __future__ import annotations

import bisect
import functools
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field

_DIE = re.compile(r"^(0x[0-9a-f]+):(\s+)(DW_TAG_\w+|NULL)")
_ATTR = re.compile(r"^\s+(DW_AT_\w+)\s+\((.*)\)\s*$")
# An attribute whose value goes on over the next lines (a location list: "(0x00000010: " or
# "(indexed (0x1) loclist = 0x00000057: ", then one "[lo, hi): EXPR" line per entry).
_ATTR_OPEN = re.compile(r"^\s+(DW_AT_\w+)\s+\((.*)$")
_LOC_ENTRY = re.compile(r"^\s*\[(0x[0-9a-f]+), (0x[0-9a-f]+)\): (.*)$")
_REF = re.compile(r"^(0x[0-9a-f]+)")
TIMEOUT_S = 20


@dataclass
class Die:
    off: int
    tag: str
    attrs: dict = field(default_factory=dict)
    children: list = field(default_factory=list)
    rust_std: bool = False  # declared in Rust's standard library (namespace core, std, alloc)


def _num(v: str | None) -> int | None:
    if v is None:
        return None
    v = v.strip().strip('"')
    try:
        return int(v, 0)
    except ValueError:
        return None


def _ref(v: str | None) -> int | None:
    m = _REF.match(v.strip()) if v else None
    return int(m.group(1), 16) if m else None


def _name(v: str | None) -> str:
    return v.strip().strip('"') if v else ""


def parse(text: str) -> dict[int, Die]:
    """The DIEs of llvm-dwarfdump's text output, by offset, with their children (by the
    indentation of their tags)."""
    dies: dict[int, Die] = {}
    stack: list[tuple[int, Die]] = []  # (indent, die)
    cur: Die | None = None
    going = None  # the attribute whose value goes on over the next lines
    for line in text.splitlines():
        m = _DIE.match(line)
        if m:
            going = None
            indent = len(m.group(2))
            while stack and stack[-1][0] >= indent:
                stack.pop()
            if m.group(3) == "NULL":
                cur = None
                continue
            cur = Die(int(m.group(1), 16), m.group(3))
            dies[cur.off] = cur
            if stack:
                stack[-1][1].children.append(cur)
                # (a unit's language is known by its first child: its attributes come first)
                top = stack[1][1] if len(stack) > 1 else cur
                cur.rust_std = stack[-1][1].rust_std or (
                    top.tag == "DW_TAG_namespace"
                    and _name(top.attrs.get("DW_AT_name")) in RUST_STD
                    and "Rust" in stack[0][1].attrs.get("DW_AT_language", "")
                )
            stack.append((indent, cur))
            continue
        a = _ATTR.match(line)
        if a and cur is not None:
            cur.attrs[a.group(1)] = a.group(2)
            going = None
            continue
        a = _ATTR_OPEN.match(line)
        if a and cur is not None:
            going = a.group(1)
            cur.attrs[going] = a.group(2)
        elif going and cur is not None and _LOC_ENTRY.match(line):
            cur.attrs[going] += "\n" + line.strip()
    return dies


def _location_at(loc: str, pc: int) -> str:
    """The expression of a location list's entry whose range holds ELF address pc (the
    list's closing parenthesis left out), "" where none does; a single location as is."""
    if "\n" not in loc:
        return loc
    for line in loc.split("\n")[1:]:
        e = _LOC_ENTRY.match(line)
        if e and int(e.group(1), 16) <= pc < int(e.group(2), 16):
            expr = e.group(3).strip()
            if expr.count(")") > expr.count("("):
                expr = expr[:-1].rstrip()
            return expr
    return ""


_QUALIFIERS = {
    "DW_TAG_typedef",
    "DW_TAG_const_type",
    "DW_TAG_volatile_type",
    "DW_TAG_atomic_type",
    "DW_TAG_restrict_type",
}
_RECORDS = {"DW_TAG_structure_type", "DW_TAG_class_type", "DW_TAG_union_type"}
_RECORD_WORDS = {
    "DW_TAG_structure_type": "struct",
    "DW_TAG_class_type": "class",
    "DW_TAG_union_type": "union",
}


@dataclass
class Layout:
    name: str  # the variable as the report names it
    type: str  # its type as DWARF names it ("stats[4]")
    size: int | None
    fortran: bool
    _dies: dict
    _type: int | None
    decl: str = ""  # "file:line" of the variable's declaration (a global's), or ""

    def field(self, off: int) -> str:
        """The innermost field holding byte `off` of the variable: `stats[1].misses`,
        `plain[3]`, `hits(2)` (Fortran); the variable's name where the type says no more."""
        return self.name + _field(self._dies, self._type, off, self.fortran, 0)

    def bit_field(self, off: int) -> bool:
        """Whether byte `off` is in a bit field (which padding cannot move apart)."""
        bits: list[bool] = []
        _field(self._dies, self._type, off, self.fortran, 0, bits)
        return bool(bits)

    def element(self) -> tuple[str, int] | None:
        """(the type as the source names it, its size) of the elements of an array variable
        whose elements are structures, unions or classes (or a typedef of one): `struct
        stats` in C, `stats` in C++, `stats_t` for a typedef; None for anything else (an array
        of scalars, a single structure, Fortran)."""
        a = _strip(self._dies, self._type)
        if a is not None and a.tag in _RECORDS:
            # A library's wrapper of one array (std::array's `_M_elems`): its elements.
            members = [c for c in a.children if c.tag == "DW_TAG_member"]
            if (
                len(members) == 1
                and _member_offset(members[0]) == 0
                and _internal_member(a, _name(members[0].attrs.get("DW_AT_name")))
            ):
                a = _strip(self._dies, _ref(members[0].attrs.get("DW_AT_type")))
        if self.fortran or a is None or a.tag != "DW_TAG_array_type":
            return None
        t = _ref(a.attrs.get("DW_AT_type"))
        size = _size(self._dies, t)
        for _ in range(16):  # past const and volatile, to the first typedef or record
            d = self._dies.get(t) if t is not None else None
            if d is None or not size:
                return None
            name = _name(d.attrs.get("DW_AT_name"))
            if d.tag == "DW_TAG_typedef":
                rec = _strip(self._dies, t)
                return (name, size) if name and rec is not None and rec.tag in _RECORDS else None
            if d.tag in _RECORDS:
                if not name:
                    return None
                # (and Rust: neither writes `struct` before a type's name)
                cxx = _in_language(self._dies, "C_plus_plus", "Rust")
                return (name if cxx else f"{_RECORD_WORDS[d.tag]} {name}", size)
            if d.tag not in _QUALIFIERS:
                return None
            t = _ref(d.attrs.get("DW_AT_type"))
        return None


@dataclass
class PointeeLayout(Layout):
    """A heap block that holds one of what its pointer points to: `p->misses`, `*p`."""

    def field(self, off: int) -> str:
        rest = _field(self._dies, self._type, off, self.fortran, 0)
        if rest.startswith("."):
            return f"{self.name}->{rest[1:]}"
        return f"(*{self.name}){rest}" if rest else f"*{self.name}"


@dataclass
class PartLayout(PointeeLayout):
    """One part of the block clang split into globals (`st.body.1`): the member of what its
    pointer points to (`st->misses`) at `base` in that type."""

    base: int = 0

    def field(self, off: int) -> str:
        return super().field(self.base + off)

    def bit_field(self, off: int) -> bool:
        return super().bit_field(self.base + off)

    def element(self) -> tuple[str, int] | None:
        return None


@dataclass
class CommonLayout(Layout):
    """A Fortran COMMON block (`common /cblock/ cblk`: the symbol `cblock_`): its members
    by their own addresses, (offset in the block, size, name, type)."""

    _members: list = field(default_factory=list)

    def field(self, off: int) -> str:
        for start, size, name, t in self._members:
            if start <= off and (size is None or off < start + size):
                return name + _field(self._dies, t, off - start, True, 0)
        return self.name


def _found_dies(found: str):
    """(offset, tag, text) of each DIE that `llvm-dwarfdump --name X --show-parents` printed,
    compile units included, in order."""
    for block in re.split(r"\n(?=0x[0-9a-f]+:)", found):
        m = _DIE.match(block)
        if m:
            yield int(m.group(1), 16), m.group(3), block


def _common_layout(path: str, name: str, vaddr: int) -> CommonLayout | None:
    """The COMMON block whose linkage name is `name` (gfortran: the block's name and `_`)."""
    cu = blk = None
    for off, tag, block in _found_dies(_run(["--name", name[:-1], "--show-parents", path])):
        if tag == "DW_TAG_compile_unit":
            cu = off
        elif tag == "DW_TAG_common_block" and f'("{name}")' in block and cu is not None:
            blk = off
            break
    if blk is None:
        return None
    dies = parse(_run([f"--debug-info={cu:#x}", "--show-children", path]))
    b = dies.get(blk)
    if b is None:
        return None
    members = []
    for c in b.children:
        loc = re.search(r"DW_OP_addr (0x[0-9a-f]+)", c.attrs.get("DW_AT_location", ""))
        if c.tag != "DW_TAG_variable" or not loc:
            continue
        t = _ref(c.attrs.get("DW_AT_type"))
        members.append((int(loc.group(1), 16) - vaddr, _size(dies, t, True),
                        _name(c.attrs.get("DW_AT_name")), t))  # fmt: skip
    if not members:
        return None
    members.sort()
    last = members[-1]
    size = last[0] + last[1] if last[1] is not None else None
    return CommonLayout(name, f"COMMON /{name[:-1]}/", size, True, dies, None, _members=members)


def _in_language(dies: dict, *languages: str) -> bool:
    """Whether a compile unit among the DIEs is in one of `languages` (parts of its
    DW_AT_language: "C_plus_plus", "Rust")."""
    return any(
        u.tag == "DW_TAG_compile_unit"
        and any(k in u.attrs.get("DW_AT_language", "") for k in languages)
        for u in dies.values()
    )


def _type_die(dies: dict, t: int | None) -> Die | None:
    """The DIE of type `t`: the unit's, else another unit's (_Units.load), else None."""
    d = dies.get(t) if t is not None else None
    if d is None and t is not None and hasattr(dies, "load"):
        d = dies.load(t)
    return d


def _strip(dies: dict, t: int | None) -> Die | None:
    for _ in range(16):
        d = _type_die(dies, t)
        if d is None or d.tag not in _QUALIFIERS:
            return d
        t = _ref(d.attrs.get("DW_AT_type"))
    return None


def _size(dies: dict, t: int | None, fortran: bool = False, depth: int = 0) -> int | None:
    d = _strip(dies, t)
    if d is None or depth > 16:
        return None
    n = _num(d.attrs.get("DW_AT_byte_size"))
    if n is not None:
        return n
    if d.tag == "DW_TAG_pointer_type" or d.tag == "DW_TAG_reference_type":
        return 8
    if d.tag == "DW_TAG_array_type":
        e = _size(dies, _ref(d.attrs.get("DW_AT_type")), fortran, depth + 1)
        dims = _dims(d, fortran)
        if e is None or dims is None:
            return None
        for _lo, n in dims:
            e *= n
        return e
    return None


def _dims(d: Die, fortran: bool) -> list[tuple[int, int]] | None:
    """(lower bound, count) of each subrange of an array type, in declaration order; the
    lower bound DWARF leaves out is the language's (Fortran 1, C 0)."""
    out = []
    for c in d.children:
        if c.tag != "DW_TAG_subrange_type":
            continue
        lo = _num(c.attrs.get("DW_AT_lower_bound"))
        lo = (1 if fortran else 0) if lo is None else lo
        n = _num(c.attrs.get("DW_AT_count"))
        if n is None:
            hi = _num(c.attrs.get("DW_AT_upper_bound"))
            if hi is None:
                return None
            n = hi - lo + 1
        if n <= 0:
            return None
        out.append((lo, n))
    return out or None


def _member_offset(c: Die) -> int:
    """A member's byte offset: DW_AT_data_member_location as a constant or, in older DWARF,
    an expression `DW_OP_plus_uconst N`; a bit field's DW_AT_data_bit_offset / 8."""
    loc = c.attrs.get("DW_AT_data_member_location")
    if loc is not None:
        n = _num(loc)
        if n is None:
            m = re.search(r"DW_OP_plus_uconst (0x[0-9a-f]+|\d+)", loc)
            n = int(m.group(1), 0) if m else None
        return n or 0
    bits = _num(c.attrs.get("DW_AT_data_bit_offset"))
    return bits // 8 if bits is not None else 0


RUST_STD = ("core", "std", "alloc")


def _internal_member(record: Die, name: str) -> bool:
    """Whether a member of a record type is one the program's source never writes: a
    reserved name of a C++ standard library's type (libstdc++'s `_M_elems` of std::array and
    `_M_i` of std::atomic), or any member of a type of Rust's standard library (`value` of
    UnsafeCell and Cell, `v` of the atomics, the `__0` of thread_local!'s state). A field is
    then named past it, as the source indexes or uses the object (`counters[1]`)."""
    if record.rust_std:
        return True
    file = _name(record.attrs.get("DW_AT_decl_file"))
    if not file:
        return False
    from locus.symbolize import is_library_source

    # (libstdc++'s `_M_x`, libc++'s `__x_`; not glibc's `__data`, `__lock`: the lock advice
    # reads a mutex's and a condition variable's words by them)
    reserved = name.startswith("_M_") or (name.startswith("__") and name.endswith("_"))
    return reserved and is_library_source(file)


def _field(
    dies: dict, t: int | None, off: int, fortran: bool, depth: int, bits_out: list | None = None
) -> str:
    d = _strip(dies, t)
    if d is None or depth > 8 or off < 0:
        return ""
    if d.tag in _RECORDS:
        sep = "%" if fortran else "."
        found = []
        for c in d.children:
            if c.tag != "DW_TAG_member":
                continue
            at = _member_offset(c)
            bits = _num(c.attrs.get("DW_AT_bit_size"))
            if bits:
                # A bit field covers the bytes of its bits, not its type's size (`int c:8`
                # at bit 16 is byte 2 alone).
                start = _num(c.attrs.get("DW_AT_data_bit_offset"))
                old = _num(c.attrs.get("DW_AT_bit_offset"))  # DWARF 2-4: from the unit's top
                unit = _num(c.attrs.get("DW_AT_byte_size"))
                if start is None and old is not None and unit:
                    start = at * 8 + unit * 8 - old - bits  # little-endian
                start = start if start is not None else at * 8
                at, sz = start // 8, (start % 8 + bits + 7) // 8
            else:
                sz = _size(dies, _ref(c.attrs.get("DW_AT_type")), fortran)
            if at <= off and (sz is None or off < at + sz):
                found.append((c, at, bool(bits)))
                if sz is not None and d.tag != "DW_TAG_union_type":
                    break
        if not found:
            return ""
        named = []
        members = sum(1 for c in d.children if c.tag == "DW_TAG_member")
        for c, at, bits in found[-1:] if d.tag != "DW_TAG_union_type" else found:
            name = _name(c.attrs.get("DW_AT_name"))
            if name and _internal_member(d, name):
                # `counters[1]`, not `counters._M_elems[1]` (a wrapper's one member, or any
                # in Rust's types, where the program's data is inside); in a library's own
                # structure (std::vector's `_M_impl._M_start`) nothing of it.
                if members > 1 and not d.rust_std:
                    named.append("")
                    continue
                name = ""
            if bits and bits_out is not None:
                bits_out.append(True)
            inner = (
                ""
                if bits
                else _field(
                    dies, _ref(c.attrs.get("DW_AT_type")), off - at, fortran, depth + 1, bits_out
                )
            )
            named.append(f"{sep}{name}{inner}" if name else inner)
        # A union: the member that names the byte most closely (`un.i[1]` for `union { long
        # l; int i[2]; }`, where `un.l` named both threads' halves alike).
        return max(named, key=len)
    if d.tag == "DW_TAG_array_type":
        et = _ref(d.attrs.get("DW_AT_type"))
        e = _size(dies, et, fortran)
        dims = _dims(d, fortran)
        if not e or not dims:
            return ""
        k, rest = divmod(off, e)
        col_major = "col_major" in d.attrs.get("DW_AT_ordering", "") or fortran
        order = list(range(len(dims)))
        if not col_major:
            order.reverse()  # C: the last index varies fastest
        idx = [0] * len(dims)
        for i in order:
            lo, n = dims[i]
            idx[i] = lo + k % n
            k //= n
        if k:
            return ""  # past the end
        inner = _field(dies, et, rest, fortran, depth + 1, bits_out)
        text = ", ".join(str(i) for i in idx) if fortran else "][".join(str(i) for i in idx)
        return f"({text}){inner}" if fortran else f"[{text}]{inner}"
    return ""


def tool() -> str | None:
    return shutil.which("llvm-dwarfdump")


def _run(args: list[str], lenient: bool = False) -> str:
    """llvm-dwarfdump's output; "" when it fails, unless `lenient` (a GNU split-DWARF 4 .dwo
    read alone: its range lists are its skeleton's, and llvm-dwarfdump exits 1 over them
    after printing everything else)."""
    exe = tool()
    if exe is None:
        return ""
    try:
        p = subprocess.run(
            [exe, *args],
            capture_output=True,
            text=True,
            errors="surrogateescape",
            timeout=TIMEOUT_S,
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return p.stdout if p.returncode == 0 or lenient else ""


_ADDRX = re.compile(r"DW_OP_(?:addrx|GNU_addr_index) (0x[0-9a-f]+)\)")


@functools.lru_cache(maxsize=16)
def _address_tables(path: str) -> dict[int, list[int]]:
    """The .debug_addr tables of the module by their DW_AT_addr_base (the offset of the
    first address: the table's own offset + its 8-byte DWARF32 header)."""
    tables: dict[int, list[int]] = {}
    start, cur = 0, None
    for line in _run(["--debug-addr", path]).splitlines():
        h = re.match(r"Address table header: length = (0x[0-9a-f]+), format = DWARF32", line)
        if h:
            cur = tables.setdefault(start + 8, [])
            start += 4 + int(h.group(1), 16)
        elif line.startswith("Addrs: [") and not tables:
            cur = tables.setdefault(-1, [])  # (GNU split DWARF 4: one list, no headers)
        elif cur is not None and re.fullmatch(r"0x[0-9a-f]+", line.strip()):
            cur.append(int(line.strip(), 16))
        elif line.startswith("Address table header"):
            cur = None  # DWARF64 or unknown: not read
    return tables


def _addr_entries(tables: dict[int, list[int]], base: int) -> list[int]:
    """The .debug_addr entries of the unit whose address table starts at `base`: a DWARF 5
    table, or GNU split DWARF 4's one list, where the base is the unit's first entry's byte
    offset."""
    if base in tables:
        return tables[base]
    flat = tables.get(-1)
    return flat[base // 8 :] if flat is not None and base % 8 == 0 else []


def variable_layout(path: str, name: str, vaddr: int, tls: bool = False) -> Layout | None:
    """The layout of the global `name` (as the report names it) at ELF virtual address
    `vaddr` of the module at `path` (tls: a thread-local variable at offset `vaddr` of the
    module's TLS block); None without debug information for it."""
    short = name.rsplit("::", 1)[-1]
    body = re.fullmatch(r"([A-Za-z_$][\w$]*)\.body", short)
    if body and not tls:
        return _promoted_layout(path, body.group(1))
    if not short or not re.fullmatch(r"[A-Za-z_$][\w$]*", short):
        return None
    lay = _variable_in(path, None, None, name, short, vaddr, tls)
    for dwo, skeleton in _split_units(path) if lay is None else ():
        lay = _variable_in(path, dwo, skeleton, name, short, vaddr, tls)
        if lay is not None:
            break
    if lay is not None:
        return lay
    return _common_layout(path, short, vaddr) if short.endswith("_") and not tls else None


@functools.lru_cache(maxsize=16)
def _split_units(path: str) -> tuple:
    """((the _Dwo, its skeleton unit's text), ...) of a module built with -gsplit-dwarf: its
    variables and types are in the .dwo files its skeleton units name (relative to their
    DW_AT_comp_dir) or in the package made of them, their addresses indices into the
    module's .debug_addr. () for a module with its DWARF in itself."""
    out = []
    # (a unit's text: its header, with DWARF 5's DWO id, and its unit DIE)
    units = _run(["--debug-info", "--recurse-depth=0", path])
    for block in re.split(r"\n(?=0x[0-9a-f]+: \w+ Unit:)", units):
        dwo = _dwo_of(path, block)
        if dwo is not None:
            out.append((dwo, block))
    return tuple(out)


def _variable_in(
    path: str, dwo: _Dwo | None, skeleton: str | None, name: str, short: str, vaddr: int, tls: bool
) -> Layout | None:
    """variable_layout's lookup in the module at `path` itself (dwo None), or in the .dwo
    file (or unit of a package) of its skeleton unit whose text is `skeleton`."""
    where = dwo.file if dwo else path
    skeleton_base = _hex_attr(skeleton, r"DW_AT_(?:GNU_)?addr_base") if skeleton else None
    found = _named(where, short) if dwo else _run(["--name", short, "--show-parents", path])
    # The variable whose location is this address, and the compile unit above it.
    cu = var = base = None
    addr = f"DW_OP_addr {vaddr:#x}"
    tls_at = re.compile(
        rf"DW_OP_const[48]u {vaddr:#x}, DW_OP_(?:GNU_push_tls_address|form_tls_address)\b"
    )
    for off, tag, block in _found_dies(found):
        if tag == "DW_TAG_compile_unit":
            # (in a package, the skeleton's own unit only: the others' indices are theirs)
            cu = off if dwo is None or dwo.holds(off) else None
            base = _hex_attr(block, "DW_AT_addr_base")
            base = skeleton_base if base is None else base
        elif tag == "DW_TAG_variable" and cu is not None:
            if tls:
                if tls_at.search(block):
                    var = off
                    break
                continue
            x = _ADDRX.search(block)
            if x and base is not None:
                # DWARF 5 (clang's default): an index into the unit's .debug_addr table.
                entries = _addr_entries(_address_tables(path), base)
                idx = int(x.group(1), 16)
                if idx < len(entries) and entries[idx] == vaddr:
                    var = off
                    break
            elif addr in block:
                var = off
                break
    if var is None or cu is None:
        return None
    if dwo is not None and skeleton is not None:  # (its file names and location lists resolved)
        dies = _split_unit(path, dwo, skeleton).dies
    else:
        dies = _Units(where, parse(_run([f"--debug-info={cu:#x}", "--show-children", where])))
    unit, v = dies.get(cu), dies.get(var)
    if unit is None or v is None:
        return None
    fortran = "Fortran" in unit.attrs.get("DW_AT_language", "")
    # A definition that completes a declaration (DW_AT_specification), or an LTO build's
    # variable whose name, type and line are its early-debug unit's (DW_AT_abstract_origin,
    # read in from that unit): the type is theirs.
    named = _origin(dies, v, far=True)
    ty = v.attrs.get("DW_AT_type") or named.attrs.get("DW_AT_type", "")
    t = _ref(ty)
    tname = ty.split('"', 1)[1].rstrip('"') if '"' in ty else ""
    return Layout(
        name, tname, _size(dies, t, fortran), fortran, dies, t, _decl(dies, v) or _decl(dies, named)
    )


def _promoted_layout(path: str, pointer: str) -> Layout | None:
    """The layout of clang's `pointer.body`: the one block a static pointer was ever given,
    made a global by LLVM's GlobalOpt (the pointer itself optimised out, its DWARF variable
    left without a location), read as what the pointer points to (`pair->s[1].hits`). None
    unless exactly one variable of that name, a pointer to a type of known size, is found."""
    found = _run(["--name", pointer, "--show-parents", path])
    cu, hits = None, []
    for off, tag, _block in _found_dies(found):
        if tag == "DW_TAG_compile_unit":
            cu = off
        elif tag == "DW_TAG_variable" and cu is not None:
            hits.append((cu, off))
    if len(hits) != 1:
        return None
    cu, var = hits[0]
    dies = _unit_dies(path, cu)
    v = dies.get(var)
    if v is None:
        return None
    ptr = _strip(dies, _ref(_origin(dies, v, far=True).attrs.get("DW_AT_type") or ""))
    if ptr is None or ptr.tag != "DW_TAG_pointer_type":
        return None
    t = _ref(ptr.attrs.get("DW_AT_type"))
    size, te = _size(dies, t), _type_die(dies, t)
    if not size or te is None:
        return None
    return PointeeLayout(pointer, _name(te.attrs.get("DW_AT_name")), size, False, dies, t)


def part_layout(path: str, pointer: str, member: str) -> Layout | None:
    """The layout of a part of clang's split promoted block (`pointer.body.N`) that is the
    member `member` of what the static pointer `pointer` points to (the part's bytes named
    `pointer->member...`); None unless the pointer's DWARF (_promoted_layout) has a structure
    with that member."""
    lay = _promoted_layout(path, pointer)
    rec = _strip(lay._dies, lay._type) if lay is not None else None
    m = _member_die(lay._dies, rec, member) if rec is not None and rec.tag in _RECORDS else None
    if lay is None or m is None:
        return None
    size = _size(lay._dies, _ref(m.attrs.get("DW_AT_type")))
    return PartLayout(lay.name, lay.type, size, False, lay._dies, lay._type, base=_member_offset(m))


def _decl(dies: dict, d: Die) -> str:
    """ "file:line" (the file's base name) of a DIE's declaration, through the declaration
    it completes (DW_AT_specification: a C++ static member's definition); "" if unknown."""
    spec = dies.get(_ref(d.attrs.get("DW_AT_specification")) or -1)
    for x in (d, spec):
        if x is None:
            continue
        file = _name(x.attrs.get("DW_AT_decl_file"))
        line = _num(x.attrs.get("DW_AT_decl_line"))
        # (a split-DWARF .dwo's files are indices llvm-dwarfdump cannot resolve there)
        if file and line and not re.fullmatch(r"0x[0-9a-f]+", file):
            return f"{file.rsplit('/', 1)[-1]}:{line}"
    return ""


# -- locals of a frame ------------------------------------------------------------------------


@dataclass
class Local:
    """A local variable in memory, at `lo` in a recorded frame."""

    name: str
    function: str  # the function whose frame holds it
    decl: str  # "file:line" of its declaration, or ""
    lo: int  # the address of its first byte
    size: int
    layout: Layout


_CFA_ROW = re.compile(r"^\s+0x([0-9a-f]+): CFA=(RSP|RBP)([+-]\d+):")
_FDE = re.compile(r"\bFDE\b.*\bpc=([0-9a-f]+)\.\.\.([0-9a-f]+)")
_FBREG = re.compile(r"^DW_OP_fbreg ([+-]?\d+)$")
_BREG = re.compile(r"^DW_OP_breg([67]) R[SB]P([+-]\d+)$")
_BASE = re.compile(r"^DW_OP_(?:reg([67]) R[SB]P|breg([67]) R[SB]P([+-]\d+))$")


@functools.lru_cache(maxsize=4)
def _fdes(path: str) -> tuple:
    """((lo, hi, rows), ...) of the module's call frame information (.eh_frame, else
    .debug_frame): each FDE's range and its rows' (address, register, offset) of the
    canonical frame address, where it is a register plus an offset (else None). The rows are
    the FDE's instructions run from its CIE's (_cfa_rows), not llvm-dwarfdump's own table,
    which LLVM 14 (Debian 12) gets wrong after DW_CFA_restore_state: the code after a
    function's early epilogue read CFA=RSP+8, 40 bytes off in a gcc -O2 main, and a frame's
    locals were looked for there."""
    for section in ("--eh-frame", "--debug-frame"):
        fdes: list = []
        cies: dict[int, list[str]] = {}
        block: list[str] | None = None
        for line in _run([section, path]).splitlines():
            c = _CIE.match(line)
            f = _FDE.search(line)
            if c:
                block = cies.setdefault(int(c.group(1), 16), [])
            elif f:
                cie = re.search(r"\bcie=([0-9a-f]+)", line)
                block = []
                fdes.append(
                    [int(f.group(1), 16), int(f.group(2), 16), [], block,
                     int(cie.group(1), 16) if cie else -1]
                )  # fmt: skip
            elif block is not None and line.strip().startswith("DW_CFA_"):
                block.append(line.strip())
            r = _CFA_ROW.match(line) if fdes and not c and not f else None
            if r:
                fdes[-1][2].append((int(r.group(1), 16), r.group(2), int(r.group(3))))
            elif fdes and not c and re.match(r"^\s+0x[0-9a-f]+: CFA=", line):
                fdes[-1][2].append((int(line.split(":")[0], 16), None, 0))
        if fdes:
            return tuple(
                (lo, hi, _cfa_rows(lo, cies.get(cie, []), ops) or rows)
                for lo, hi, rows, ops, cie in fdes
            )
    return ()


_CIE = re.compile(r"^([0-9a-f]{8}) [0-9a-f]+ [0-9a-f]+ CIE\b")
_CFA_OP = re.compile(r"^(DW_CFA_\w+):\s*(.*)$")


def _cfa_rows(lo: int, cie: list[str], fde: list[str]) -> list:
    """[(address, "RSP" or "RBP" or None, offset)]: the canonical frame address at each
    address where it changes, from the CIE's initial instructions and the FDE's (as
    llvm-dwarfdump prints them: advances in bytes, offsets unfactored); [] where an
    instruction it does not know would change it."""
    reg: str | None = None
    off, pc = 0, lo
    stack: list[tuple] = []
    rows: list = []
    for i, text in enumerate([*cie, *fde]):
        m = _CFA_OP.match(text)
        if not m:
            return []
        op, arg = m.group(1), m.group(2).split()
        if op.startswith("DW_CFA_advance_loc"):
            if i < len(cie):
                return []  # (an initial instruction never advances)
            pc += int(arg[0])
            continue
        if op in ("DW_CFA_def_cfa", "DW_CFA_def_cfa_sf"):
            reg, off = arg[0], int(arg[1])
        elif op in ("DW_CFA_def_cfa_offset", "DW_CFA_def_cfa_offset_sf"):
            off = int(arg[0])
        elif op == "DW_CFA_def_cfa_register":
            reg = arg[0]
        elif op == "DW_CFA_def_cfa_expression":
            reg = None
        elif op == "DW_CFA_remember_state":
            stack.append((reg, off))
            continue
        elif op == "DW_CFA_restore_state":
            if not stack:
                return []
            reg, off = stack.pop()
        elif op in ("DW_CFA_set_loc", "DW_CFA_val_expression") and i >= len(cie):
            return []
        else:
            continue  # (a register's rule: the CFA stays)
        row = (pc, reg if reg in ("RSP", "RBP") else None, off if reg in ("RSP", "RBP") else 0)
        if rows and rows[-1][0] == pc:
            rows[-1] = row
        else:
            rows.append(row)
    if not rows or rows[0][0] != lo:
        return []
    return rows


def _cfa_rule(path: str, pc: int) -> tuple[str, int] | None:
    """("RSP" or "RBP", offset) of the canonical frame address at ELF address pc; None where
    it is another expression or unknown."""
    for lo, hi, rows in _fdes(path):
        if lo <= pc < hi:
            at = [r for r in rows if r[0] <= pc]
            return (at[-1][1], at[-1][2]) if at and at[-1][1] else None
    return None


@functools.lru_cache(maxsize=16)
def _unit_dies(path: str, cu: int) -> dict:
    """A compile unit's DIEs (parse), kept for the next frames of the same unit."""
    return _Units(path, parse(_run([f"--debug-info={cu:#x}", "--show-children", path])))


class _Units(dict):
    """A unit's DIEs by offset, that can read in the unit of a type or variable outside them
    (a DW_FORM_ref_addr into another unit: rustc's codegen units keep a crate's types in
    several, as LTO partitions do, and an LTO build names a function's variables through
    its source file's early-debug unit): `load`, which _strip calls for a type it does not
    find and _origin for a variable (not for Rust's inlined callees, whose origins are in
    the standard library's units: seconds to read); at most UNITS_MORE units."""

    def __init__(self, path: str, dies: dict):
        super().__init__(dies)
        self.path = path
        self.tried: set[int] = set()

    def load(self, key: int):
        if key < 0 or key in self.tried or len(self.tried) >= UNITS_MORE:
            return None
        self.tried.add(key)
        cu = _unit_of(self.path, key)
        if cu is not None:
            self.update(parse(_run([f"--debug-info={cu:#x}", "--show-children", self.path])))
        return super().get(key)


UNITS_MORE = 4  # other units a unit's DIEs read types from


@functools.lru_cache(maxsize=256)
def _unit_of(path: str, off: int) -> int | None:
    """The offset of the compile unit holding the DIE at `off`, or None."""
    m = re.search(
        r"^(0x[0-9a-f]+):\s+DW_TAG_compile_unit",
        _run([f"--debug-info={off:#x}", "--show-parents", path]),
        re.M,
    )
    return int(m.group(1), 16) if m else None


def _origin(dies: dict, d: Die, far: bool = False) -> Die:
    """The DIE that names `d`: its abstract origin's (an inlined or out-of-line copy), and
    that one's specification (a C++ member function or a Rust function defined outside its
    declaration, whose name is the declaration's). `far`: an origin in another unit is read
    in (_Units.load): an LTO build's functions name their variables through the source
    file's early-debug unit (`DW_AT_abstract_origin (0x50db "pair")`, a DW_FORM_ref_addr)."""
    for _ in range(4):
        ref = _ref(d.attrs.get("DW_AT_abstract_origin") or d.attrs.get("DW_AT_specification"))
        o = dies.get(ref if ref is not None else -1)
        if o is None and far and ref is not None and isinstance(dies, _Units):
            o = dies.load(ref)
        if o is None:
            return d
        d = o
    return d


def _in_inlined(dies: dict, d: Die | None) -> bool:
    """Whether a scope is, or is inside, an inlined function's copy: its variables' origins
    are the callee's, often in a library's units (Rust's standard library: seconds to read)."""
    parent = _parents(dies)
    while d is not None and d.tag not in ("DW_TAG_subprogram", "DW_TAG_compile_unit"):
        if d.tag == _INLINED:
            return True
        d = parent.get(d.off)
    return False


_INLINED = "DW_TAG_inlined_subroutine"


_PARENTS: list = [None, {}]  # (the unit's DIEs, each DIE's parent): the last unit asked


def _parents(dies: dict) -> dict[int, Die]:
    """Each DIE's parent in a unit (_unit_dies), made once for the unit asked last."""
    if _PARENTS[0] is not dies:
        _PARENTS[:] = [dies, {c.off: p for p in dies.values() for c in p.children}]
    return _PARENTS[1]


_VARIABLES = ("DW_TAG_variable", "DW_TAG_formal_parameter")
_NO_DIE = Die(-1, "", {})


def _far(dies: dict, scope: Die) -> bool:
    """Whether the origins of a scope's DIEs are read in from other units (_origin's `far`).
    An inlined callee's are in its own unit: in an LTO build the unit of the callee's source
    file, read in as the function's own are; in Rust the standard library's units, which
    take seconds to read, and are not."""
    rust = "Rust" in next(iter(dies.values()), _NO_DIE).attrs.get("DW_AT_language", "")
    return not (rust and _in_inlined(dies, scope))


def _scope_vars(dies: dict, scopes: list[Die], tags=("DW_TAG_variable",)):
    """(DIE, the DIE that names it, its name, its type) of each variable (or parameter, by
    `tags`) of the scopes, innermost first."""
    for scope in scopes:
        far = _far(dies, scope)
        for v in scope.children:
            if v.tag in tags:
                named = _origin(dies, v, far)
                t = _ref(v.attrs.get("DW_AT_type") or named.attrs.get("DW_AT_type"))
                yield v, named, _name(named.attrs.get("DW_AT_name")), t


@functools.lru_cache(maxsize=64)
def _lookup(path: str, pc: int) -> str:
    """llvm-dwarfdump's lookup of the call returning to pc: its unit, function and blocks,
    and its line."""
    return _run([f"--lookup={pc - 1:#x}", path])


def _scopes(path: str, pc: int) -> tuple[dict, bool, list[Die]] | None:
    """(the unit's DIEs, whether it is Fortran, the scopes around the call returning to pc:
    innermost first, up to its function, whose frame they all are), or None without debug
    information there. The lookup leaves out the function a call was inlined into: the
    chain is followed up the unit's tree."""
    found = _lookup(path, pc)
    chain = [int(m.group(1), 16) for m in re.finditer(r"^(0x[0-9a-f]+):\s+DW_TAG_", found, re.M)]
    tags = re.findall(r"^0x[0-9a-f]+:\s+(DW_TAG_\w+)", found, re.M)
    if len(chain) == 1 and _str_attr(found, _DWO_NAME):
        return _split_scopes(path, pc, found)
    if len(chain) < 2 or tags[0] != "DW_TAG_compile_unit":
        return None
    dies = _unit_dies(path, chain[0])
    unit = dies.get(chain[0])
    parent = _parents(dies)
    scopes, d = [], dies.get(chain[-1])
    while d is not None and d.tag != "DW_TAG_compile_unit":
        scopes.append(d)
        if d.tag == "DW_TAG_subprogram":
            break
        d = parent.get(d.off)
    if unit is None or not scopes or scopes[-1].tag != "DW_TAG_subprogram":
        return None
    return dies, "Fortran" in unit.attrs.get("DW_AT_language", ""), scopes


_DWO_NAME = "DW_AT_(?:GNU_)?dwo_name"
_INDEXED = re.compile(r"indexed \(([0-9a-fx]+)\) address")
_PC_SCOPES = ("DW_TAG_subprogram", _INLINED, "DW_TAG_lexical_block")
# Where a unit's functions may be defined: inside its namespaces, classes and modules.
_SCOPE_HOLDERS = ("DW_TAG_namespace", "DW_TAG_structure_type", "DW_TAG_class_type", "DW_TAG_module")


@dataclass(frozen=True)
class _Dwo:
    """Where a skeleton unit's DWARF is: its .dwo `file`, or its unit in a package (a .dwp,
    which `dwp` or `llvm-dwp` makes of a program's .dwo files): `info`, the unit's [start,
    end) in the package's .debug_info.dwo, and `line`, its line table's offset in
    .debug_line.dwo."""

    file: str
    info: tuple[int, int] | None = None
    line: int | None = None

    def holds(self, off: int) -> bool:
        """Whether the DIE at `off` of the file is the unit's."""
        return self.info is None or self.info[0] <= off < self.info[1]


def _dwo_of(path: str, skeleton: str) -> _Dwo | None:
    """Where the DWARF of a skeleton unit (its text) of the module at `path` is: the .dwo file
    it names, relative to its DW_AT_comp_dir, or else its unit, by its DWO id, in the package
    PATH.dwp beside the module (where gdb looks for it); None without either."""
    f = _str_attr(skeleton, _DWO_NAME)
    if not f:
        return None
    cdir = _str_attr(skeleton, "DW_AT_comp_dir")
    if not f.startswith("/") and cdir:
        f = os.path.join(cdir, f)
    if os.path.exists(f):
        return _Dwo(f)
    m = re.search(r"\bDWO_id = (0x[0-9a-f]+)", skeleton)  # (DWARF 5: the unit's header)
    uid = int(m.group(1), 16) if m else _hex_attr(skeleton, "DW_AT_GNU_dwo_id")
    for pkg in dict.fromkeys((path + ".dwp", os.path.realpath(path) + ".dwp")):
        unit = _dwp_index(pkg).get(uid) if uid is not None else None
        if unit and "INFO" in unit:
            return _Dwo(pkg, unit["INFO"], unit["LINE"][0] if "LINE" in unit else None)
    return None


@functools.lru_cache(maxsize=16)
def _dwp_index(pkg: str) -> dict[int, dict[str, tuple[int, int]]]:
    """A package's units by DWO id: each section's contribution of the unit, [start, end),
    by the index's column name (INFO, ABBREV, LINE, LOCLISTS or LOC, STR_OFFSETS,
    RNGLISTS), from its .debug_cu_index; {} for no package."""
    if not os.path.isfile(pkg):
        return {}
    cols: list[str] = []
    units: dict[int, dict[str, tuple[int, int]]] = {}
    for line in _run(["--debug-cu-index", pkg]).splitlines():
        if line.startswith("Index Signature"):
            cols = line.split()[2:]
            continue
        m = re.match(r"\s*\d+ (0x[0-9a-f]+) (.*)$", line)
        if m and cols:
            spans = re.findall(r"\[(0x[0-9a-f]+), (0x[0-9a-f]+)\)", m.group(2))
            units[int(m.group(1), 16)] = {
                c: (int(a, 16), int(b, 16)) for c, (a, b) in zip(cols, spans)
            }
    return units


@functools.lru_cache(maxsize=32)
def _named(where: str, short: str) -> str:
    """`--name short --show-parents` of a .dwo file or package (lenient, as _run says), kept:
    a package is searched once for the skeleton units of all its units."""
    return _run(["--name", short, "--show-parents", where], True)


def _hex_attr(text: str, attr: str) -> int | None:
    """The number an attribute (a regular expression of its name) has in llvm-dwarfdump's
    text; None where it is not there."""
    m = re.search(rf"{attr}\s+\((0x[0-9a-f]+)\)", text)
    return int(m.group(1), 16) if m else None


def _str_attr(text: str, attr: str) -> str | None:
    """The string an attribute has in llvm-dwarfdump's text; None where it is not there."""
    m = re.search(rf"{attr}\s+\(\"([^\"]*)\"\)", text)
    return m.group(1) if m else None


@functools.lru_cache(maxsize=16)
def _section(path: str, name: str) -> bytes:
    """The bytes of an ELF file's section `name`; b"" without it."""
    from .symbolize import _elf64le, _section_headers  # (symbolize imports this module)

    try:
        with open(path, "rb") as f:
            eh = f.read(64)
            for sname, _typ, _fl, _addr, off, size in (
                _section_headers(f, eh) if _elf64le(eh) else []
            ):
                if sname == name.encode():
                    f.seek(off)
                    return f.read(size)
    except OSError:
        pass
    return b""


def _uleb(data: bytes, off: int) -> tuple[int, int]:
    v = shift = 0
    while off < len(data):
        b = data[off]
        off += 1
        v |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            break
    return v, off


class _SplitUnit:
    """A -gsplit-dwarf unit: its .dwo's DIEs, with the module's addresses. Its addresses are
    indices into the module's .debug_addr, from its skeleton's DW_AT_addr_base; its range
    lists are the .dwo's .debug_rnglists.dwo (DWARF 5) or, GNU's DWARF 4, the module's
    .debug_ranges from the skeleton's DW_AT_GNU_ranges_base. Its location lists are
    rewritten into the resolved "[lo, hi): EXPR" entries the rest of this module reads, its
    DW_AT_decl_file indices into the names of the .dwo's own line table's files. In a
    package, the unit's part of it: its DIEs and line table (llvm-dwarfdump gives its
    location and range lists' offsets in the package's sections)."""

    def __init__(self, path: str, dwo: _Dwo, skeleton: str):
        self.path, self.file = path, dwo.file
        base = _hex_attr(skeleton, r"DW_AT_(?:GNU_)?addr_base")
        self.entries = _addr_entries(_address_tables(path), base) if base is not None else []
        self.low = _hex_attr(skeleton, "DW_AT_low_pc") or 0
        self.ranges_base = _hex_attr(skeleton, "DW_AT_GNU_ranges_base")
        self.v4 = re.search(r"version = 0x0004", skeleton[:2000]) is not None
        if dwo.info is None:
            text = _run(["--debug-info", dwo.file], True)
        else:  # (its unit DIE: after the unit's header, 11 bytes in DWARF 4, 20 in DWARF 5)
            die = dwo.info[0] + (11 if self.v4 else 20)
            text = _run([f"--debug-info={die:#x}", "--show-children", dwo.file], True)
        # The files its DW_AT_decl_file indices are of: the .dwo's own line table's (gcc),
        # or the skeleton's in the module (clang's .dwo has none).
        files = re.compile(r"file_names\[\s*(\d+)\]:\s*\n\s*name: \"([^\"]*)\"")
        stmt = _hex_attr(skeleton, "DW_AT_stmt_list")
        if dwo.info is None:
            found = files.findall(_run(["--debug-line", dwo.file], True))
        elif dwo.line is not None:
            found = files.findall(_run([f"--debug-line={dwo.line:#x}", dwo.file], True))
        else:
            found = []
        if not found and stmt is not None:
            found = files.findall(_run([f"--debug-line={stmt:#x}", path]))
        self.files = {int(k): name for k, name in found}
        self.dies = _Units(dwo.file, parse(self._resolved(text)))

    def entry(self, idx: int) -> int | None:
        return self.entries[idx] if 0 <= idx < len(self.entries) else None

    def _resolved(self, text: str) -> str:
        """The .dwo's text with its location lists' entries (an address index and a length,
        two indices, or offsets from a base address index) as resolved ranges; entries not
        resolved are left out."""
        out, base = [], None
        for line in text.splitlines():
            f = re.match(r"^(\s*DW_AT_(?:decl|call)_file\s+)\((0x[0-9a-f]+|\d+)\)$", line)
            if f and int(f.group(2), 0) in self.files:
                line = f'{f.group(1)}("{self.files[int(f.group(2), 0)]}")'
            m = re.match(r"^(\s*)DW_LLE_(\w+)\s+\((0x[0-9a-f]+)(?:, (0x[0-9a-f]+))?\)(:.*)?$", line)
            if not m:
                if "DW_AT_" in line:
                    base = None
                out.append(line)
                continue
            kind, a, b, rest = m.group(2), int(m.group(3), 16), m.group(4), m.group(5) or ""
            b = int(b, 16) if b else 0
            lo = hi = None
            if kind == "base_addressx":
                base = self.entry(a)
            elif kind in ("startx_length", "startx_endx"):
                lo = self.entry(a)
                hi = (
                    (lo + b if lo is not None else None)
                    if kind == "startx_length"
                    else self.entry(b)
                )
            elif kind == "offset_pair" and base is not None:
                lo, hi = base + a, base + b
            elif kind in ("start_length", "start_end"):
                lo, hi = a, (a + b if kind == "start_length" else b)
            if lo is not None and hi is not None and rest:
                out.append(f"{m.group(1)}[{lo:#x}, {hi:#x}){rest}")
        return "\n".join(out)

    def ranges(self, d: Die) -> list[tuple[int, int]]:
        """The address ranges of a DIE of the unit; [] where they are not known."""
        m = _INDEXED.match(d.attrs.get("DW_AT_low_pc", ""))
        if m:
            lo = self.entry(int(m.group(1), 16))
            hv = d.attrs.get("DW_AT_high_pc", "")
            hm = _INDEXED.match(hv)
            hi = self.entry(int(hm.group(1), 16)) if hm else None
            if not hm and lo is not None and _num(hv) is not None:
                hi = lo + (_num(hv) or 0)  # (a length: DW_FORM_data)
            return [(lo, hi)] if lo is not None and hi is not None else []
        r = d.attrs.get("DW_AT_ranges", "")
        m = re.search(r"rangelist = (0x[0-9a-f]+)", r) or re.match(r"\s*(0x[0-9a-f]+)", r)
        if not m:
            return []
        off = int(m.group(1), 16)
        if not self.v4:
            return self._rnglist(_section(self.file, ".debug_rnglists.dwo"), off)
        if self.ranges_base is None:
            return []
        return self._ranges4(_section(self.path, ".debug_ranges"), self.ranges_base + off)

    def _rnglist(self, data: bytes, off: int) -> list[tuple[int, int]]:
        """A DWARF 5 range list (DW_RLE_* entries) at offset off of data."""
        out, base = [], self.low
        while off < len(data):
            kind = data[off]
            off += 1
            if kind == 0:  # end_of_list
                break
            if kind in (5, 6, 7):  # base_address, start_end, start_length: 8-byte addresses
                a = int.from_bytes(data[off : off + 8], "little")
                off += 8
                if kind == 5:
                    base = a
                elif kind == 6:
                    out.append((a, int.from_bytes(data[off : off + 8], "little")))
                    off += 8
                else:
                    n, off = _uleb(data, off)
                    out.append((a, a + n))
                continue
            if kind not in (1, 2, 3, 4):
                return []  # (unknown: the rest cannot be read)
            a, off = _uleb(data, off)
            if kind == 1:  # base_addressx
                base = self.entry(a)
                continue
            b, off = _uleb(data, off)
            lo = self.entry(a) if kind in (2, 3) else (base + a if base is not None else None)
            hi = (
                self.entry(b)
                if kind == 2
                else lo + b
                if kind == 3 and lo is not None
                else base + b
                if kind == 4 and base is not None
                else None
            )
            if lo is not None and hi is not None:
                out.append((lo, hi))
        return out

    def _ranges4(self, data: bytes, off: int) -> list[tuple[int, int]]:
        """A DWARF 4 range list (.debug_ranges: pairs of addresses from the unit's base, a
        pair starting with all ones setting the base) at offset off of data."""
        out, base = [], self.low
        while off + 16 <= len(data):
            a = int.from_bytes(data[off : off + 8], "little")
            b = int.from_bytes(data[off + 8 : off + 16], "little")
            off += 16
            if a == b == 0:
                break
            if a == (1 << 64) - 1:
                base = b
            else:
                out.append((base + a, base + b))
        return out

    def covers(self, d: Die, pc: int) -> bool:
        return any(lo <= pc < hi for lo, hi in self.ranges(d))


_SPLIT_UNITS: dict = {}


def _split_unit(path: str, dwo: _Dwo, skeleton: str) -> _SplitUnit:
    """The .dwo's _SplitUnit, read once (its skeleton's text is the lookup's or the unit
    list's: either says the same of it)."""
    if (path, dwo) not in _SPLIT_UNITS:
        if len(_SPLIT_UNITS) >= 8:
            _SPLIT_UNITS.pop(next(iter(_SPLIT_UNITS)))
        _SPLIT_UNITS[path, dwo] = _SplitUnit(path, dwo, skeleton)
    return _SPLIT_UNITS[path, dwo]


def _split_scopes(path: str, pc: int, found: str) -> tuple[dict, bool, list[Die]] | None:
    """_scopes in a module built with -gsplit-dwarf, where the lookup finds the skeleton
    unit only: the functions, inlined calls and blocks around the call are its .dwo's, found
    by their address ranges (_SplitUnit)."""
    dwo = _dwo_of(path, found)
    if dwo is None:
        return None
    # (the skeleton unit's own attributes: the lookup's text up to its line information)
    unit = _split_unit(path, dwo, found.split("\nLine info:", 1)[0])
    top = next((d for d in unit.dies.values() if d.tag == "DW_TAG_compile_unit"), None)
    if top is None:
        return None
    outer_first, d = [], top
    while d is not None:
        todo, d = list(d.children), None
        while todo:
            c = todo.pop()
            if c.tag in _PC_SCOPES and unit.covers(c, pc - 1):
                d = c
                outer_first.append(c)
                break
            if c.tag in _SCOPE_HOLDERS and not outer_first:
                todo += c.children
    scopes = []
    for d in reversed(outer_first):
        scopes.append(d)
        if d.tag == "DW_TAG_subprogram":
            break
    if not scopes or scopes[-1].tag != "DW_TAG_subprogram":
        return None
    return unit.dies, "Fortran" in top.attrs.get("DW_AT_language", ""), scopes


def heap_layout(path: str, pc: int, line: int, size: int) -> Layout | None:
    """The layout of a heap block of `size` bytes that the call returning to ELF address pc
    allocated, where that call's source line declares the one pointer in scope that takes
    it (`struct stats *s = calloc(n, sizeof *s);`), or the one std::vector constructed
    there (`std::vector<stats> s(n);`), or, declaring none, assigns one pointer declared
    elsewhere (`s = calloc(n, sizeof *s);`, `c->stats = ...`, read in the source file where
    it can be: a local or parameter of the function, a global of the unit, a member of one):
    an array of what it points to or holds, named after it (`s[1].misses`; a pointer's block
    of one: `s->misses`). None otherwise (several declared or assigned there, an element
    assigned, a pointer to void or to a type of unknown size, the source not found)."""
    found = _scopes(path, pc)
    if found is None or not line:
        return None
    dies, fortran, scopes = found
    hits = _declared_holders(dies, fortran, _scope_vars(dies, scopes), line)
    if not hits and _in_language(dies, "Rust"):
        # Rust opens a lexical block at each `let`, after its initializer: the variable the
        # allocating line declares is in a block of the function that does not hold the call.
        blocks, todo = [], list(scopes[-1].children)
        while todo:
            d = todo.pop()
            if d.tag == "DW_TAG_lexical_block":
                blocks.append(d)
                todo += d.children
        hits = _declared_holders(dies, fortran, _scope_vars(dies, blocks), line)
    if not hits:
        hits = _assigned(path, pc, line, dies, fortran, scopes)
    if len(hits) != 1 or not hits[0][0]:
        return None
    name, t, esize, pointer = hits[0]
    n = max(1, size // esize)
    te = _type_die(dies, t)  # (the type as named: a typedef's name)
    tname = _name(te.attrs.get("DW_AT_name")) if te is not None else ""
    if n == 1 and pointer:  # (a vector of one is still indexed: counts[0].n)
        return PointeeLayout(name, tname, esize, fortran, dies, t)
    # The block as an array of n of them: a DIE of the walk's own, beside the unit's.
    key = -(len(dies) + 1)
    sub = Die(key - 1, "DW_TAG_subrange_type", {"DW_AT_count": str(n)})
    dies[key] = Die(key, "DW_TAG_array_type", {"DW_AT_type": f"{t:#x}"}, [sub])
    return Layout(name, f"{tname}[{n}]", n * esize, fortran, dies, key)


def _template_arg(dies: dict, record: Die, name: str) -> int | None:
    """The type (a DIE offset) of a record's template type parameter `name`, or None."""
    for c in record.children:
        if c.tag == "DW_TAG_template_type_parameter" and _name(c.attrs.get("DW_AT_name")) == name:
            return _ref(c.attrs.get("DW_AT_type"))
    return None


def _declared_holders(dies: dict, fortran: bool, variables, line: int) -> list:
    """[(name, element type, its size, whether a pointer)] of the variables declared at
    `line` that hold a heap block's elements: a pointer, a std::vector, a Rust Vec (in an Arc,
    Rc or Box or not)."""
    hits = []
    for _v, named, vname, vt in variables:
        ptr = _strip(dies, vt)
        if ptr is None or _num(named.attrs.get("DW_AT_decl_line")) != line:
            continue
        if ptr.tag == "DW_TAG_pointer_type":
            t = _ref(ptr.attrs.get("DW_AT_type"))
        elif ptr.tag in _RECORDS and _name(ptr.attrs.get("DW_AT_name")).startswith("vector<"):
            # A std::vector constructed with its elements on that line: its storage holds
            # its template argument (`_Tp`, libstdc++ and libc++ alike).
            t = _template_arg(dies, ptr, "_Tp")
        elif ptr.tag in _RECORDS and ptr.rust_std:
            # Rust's Vec<T> made on that line (`let v: Vec<AtomicU64> = ...collect()`), or
            # shared through an Arc, Rc or Box around it: its buffer holds T.
            rec = ptr
            for _ in range(2):
                if not _name(rec.attrs.get("DW_AT_name")).startswith(("Arc<", "Rc<", "Box<")):
                    break
                inner = _strip(dies, _template_arg(dies, rec, "T"))
                if inner is None or inner.tag not in _RECORDS:
                    break
                rec = inner
            if not _name(rec.attrs.get("DW_AT_name")).startswith("Vec<"):
                continue
            t = _template_arg(dies, rec, "T")
        else:
            continue
        esize = _size(dies, t, fortran)
        if esize:
            hits.append((vname, t, esize, ptr.tag == "DW_TAG_pointer_type"))
    return hits


# What a source line assigns: a variable (`st = calloc(n, sizeof *st);`, `if (!(p =
# malloc(n)))`), a member of one (`pool.st =`, `ctx->stats =`, `this->buf =`), an element
# (`ctr[t] =`, `ctx->bufs[i] =`); not what a pointer points to (`*pp =`), a comparison.
_ASSIGNS = re.compile(
    r"(?<![\w.>\]*])\s*([A-Za-z_]\w*(?:\s*(?:\[[^\[\]=]*\]|(?:\.|->)\s*[A-Za-z_]\w*))*)\s*=(?!=)"
)
# Its steps: the variable, then `[...]`, `.`, `->` and the members' names.
_STEPS = re.compile(r"\[[^\[\]]*\]|->|\.|[A-Za-z_]\w*")


def _member(dies: dict, rec: Die, name: str) -> int | None:
    """The type of the member `name` of a structure, union or class (its definition in the
    unit where `rec` only declares it)."""
    m = _member_die(dies, rec, name)
    return _ref(m.attrs.get("DW_AT_type")) if m is not None else None


def _member_die(dies: dict, rec: Die, name: str) -> Die | None:
    """The member `name` of a structure, union or class (_member)."""
    if not rec.children and rec.attrs.get("DW_AT_declaration"):
        tname = _name(rec.attrs.get("DW_AT_name"))
        rec = next(
            (d for d in dies.values() if d.tag == rec.tag and d.children
             and _name(d.attrs.get("DW_AT_name")) == tname),
            rec,
        )  # fmt: skip
    for m in rec.children:
        if m.tag == "DW_TAG_member" and _name(m.attrs.get("DW_AT_name")) == name:
            return m
    return None


def _chain_type(dies: dict, t: int | None, steps: list[str]) -> int | None:
    """The type reached from type t by `[i]`, `.m` and `->m` steps (["[i]", ".", "m", ...])."""
    k = 0
    while k < len(steps):
        d = _strip(dies, t)
        if d is None:
            return None
        if steps[k].startswith("["):  # an element of an array, or what a pointer points to
            if d.tag not in ("DW_TAG_array_type", "DW_TAG_pointer_type"):
                return None
            t, k = _ref(d.attrs.get("DW_AT_type")), k + 1
            continue
        if steps[k] == "->":
            if d.tag != "DW_TAG_pointer_type":
                return None
            d = _strip(dies, _ref(d.attrs.get("DW_AT_type")))
        if d is None or d.tag not in _RECORDS or k + 1 >= len(steps):
            return None
        t, k = _member(dies, d, steps[k + 1]), k + 2
    return t


def source_text(path: str, pc: int, line: int) -> str:
    """The text of source line `line` of the instruction at ELF address pc, if the line
    table gives it that line and its file can be read; "" otherwise."""
    return _source_line(path, pc + 1, line)  # (_source_line looks up the byte before pc)


def _source_line(path: str, pc: int, line: int, dies: dict | None = None) -> str:
    """The text of the source line of the call returning to pc, if it is `line` and its
    file can be read: the line table names it without its directory, which the unit's or a
    function's file of that name says (relative to the unit's directory). An LTO build's
    unit is "<artificial>" and its functions name no file: the source file's early-debug
    unit among `dies` (read in for the function's own names, _Units.load) names it then."""
    found = _lookup(path, pc)
    m = re.search(r"^Line info: file '([^']*)', line (\d+)", found, re.M)
    if not m or int(m.group(2)) != line:
        return ""
    base = m.group(1).rsplit("/", 1)[-1]
    names = re.findall(r"DW_AT_(?:name|decl_file)\s+\(\"([^\"]+)\"\)", found)
    name = next((n for n in names if n.rsplit("/", 1)[-1] == base), "")
    cdir = _str_attr(found, "DW_AT_comp_dir") or ""
    if not name and dies:
        units = [
            (_name(u.attrs.get("DW_AT_name")), _name(u.attrs.get("DW_AT_comp_dir")))
            for u in dies.values()
            if u.tag == "DW_TAG_compile_unit"
        ]
        units = [u for u in units if u[0].rsplit("/", 1)[-1] == base]
        if len(units) == 1:  # (two files of that name: neither)
            name, cdir = units[0]
    if name and not name.startswith("/") and cdir:
        name = f"{cdir}/{name}"
    if not name:
        return ""
    try:
        with open(name, encoding="utf-8", errors="replace") as f:
            for k, text in enumerate(f, 1):
                if k == line:
                    return text
    except OSError:
        pass
    return ""


def _assigned(path: str, pc: int, line: int, dies: dict, fortran: bool, scopes: list[Die]):
    """[(name, pointee type, its size, True)] for the pointer that the allocating line assigns
    the block to, when it assigns one variable (a local or parameter of the scopes around
    the call, else the unit's global), or a member of one, of pointer type; [] otherwise."""
    for scope in scopes:  # (an LTO build's: the source files' units, read in)
        _origin(dies, scope, far=_far(dies, scope))
    text = _source_line(path, pc, line, dies).split("//")[0]
    # (the assignments of a call's or a new's result: not `i = 0` in `for (i = 0; ...)`)
    found = {
        "".join(_STEPS.findall(m.group(1)))
        for m in _ASSIGNS.finditer(text)
        if re.search(r"[\w>]\s*\(|\bnew\b", text[m.end() :].split(";")[0])
    }
    if fortran or len(found) != 1:
        return []
    (want,) = found
    chain = _STEPS.findall(want)  # [variable, "[i]" or sep, member, ...]
    unit = next((d for d in dies.values() if d.tag == "DW_TAG_compile_unit"), None)
    # (a C++ member function's own member, `counts = new ...`: this->counts)
    around = [*scopes, *([unit] if unit is not None else [])]
    for names in (chain, ["this", "->", *chain]):
        for _v, _named, vname, vt in _scope_vars(dies, around, _VARIABLES):
            if vname != names[0]:
                continue
            ptr = _strip(dies, _chain_type(dies, vt, names[1:]))
            if ptr is None or ptr.tag != "DW_TAG_pointer_type":
                return []
            t = _ref(ptr.attrs.get("DW_AT_type"))
            esize = _size(dies, t, fortran)
            return [(want, t, esize, True)] if esize else []
    return []


def _function_name(dies: dict, fn: Die) -> str:
    """A function's name as the source says it, with its class's (`Pool::run`, a C++ member
    function defined outside its class: its name is the declaration's, in the class). An
    out-of-line function's origin may be in another unit (an LTO build's early-debug unit);
    an inlined copy's is its callee's, never read in (see _in_inlined)."""
    d = _origin(dies, fn, far=fn.tag == "DW_TAG_subprogram")
    parents = _parents(dies)
    name = _name(d.attrs.get("DW_AT_name"))
    p = parents.get(d.off)
    while name and p is not None and p.tag in _RECORDS and p.attrs.get("DW_AT_name"):
        name = f"{_name(p.attrs.get('DW_AT_name'))}::{name}"
        p = parents.get(p.off)
    return name


# The functions a compiler outlines an OpenMP region's (or task's) body into: GCC's
# `main._omp_fn.0`, clang's `.omp_outlined.`, `.omp_outlined._debug__`, `.omp_outlined..1`
# (and `main.omp_outlined` from clang 16 on).
_OUTLINED = re.compile(r"(?:(.+?)\._omp_fn\.\d+|(?:(.+?)\.)?\.?omp_outlined(?:\.|_debug__|\d)*)")
_REGION = "an OpenMP region"


def _runs_in(fn: str, function: str) -> bool:
    """Whether code of function `fn` (as the symbolizer names it) runs in the frame of
    `function` (a local's, as _function_name names it): the function itself, or the body of
    an OpenMP region gcc outlined from it (`phase_a._omp_fn.0`; clang's `.omp_outlined.`
    names no parent). C++ names are compared without their parameters."""
    name = function.split("(", 1)[0]
    if not name:
        return False
    base = fn.split("(", 1)[0]
    m = _OUTLINED.fullmatch(base)
    return base == name or (m is not None and (m.group(1) or m.group(2) or "") == name)


def omp_outlined(name: str) -> bool:
    """Whether a function is the body of an OpenMP region (or task) a compiler outlined."""
    return _OUTLINED.fullmatch(name) is not None


def _region(name: str) -> str:
    """A function's name, or "an OpenMP region in main" for the body of a region."""
    m = _OUTLINED.fullmatch(name)
    if m is None:
        return name
    parent = m.group(1) or m.group(2)
    return f"{_REGION} in {parent}" if parent else _REGION


def _frame_base(expr: str, path: str, pc: int, regs: dict) -> int | None:
    """A function's frame base (DW_AT_frame_base) at the call returning to pc, its stack and
    frame pointers in regs: the stack or frame pointer (DW_OP_reg7, DW_OP_breg6 n), or the
    canonical frame address from the call's row of the call frame information, with an
    offset added where the expression says so (`DW_OP_call_frame_cfa, DW_OP_consts -176,
    DW_OP_plus`: rustc's, LLVM's realigned frames); None for anything else."""
    stack: list[int] = []
    for op in [x.strip() for x in expr.strip().split(",") if x.strip()]:
        m = _BASE.match(op)
        word, _, arg = op.partition(" ")
        if m:
            stack.append(regs[m.group(1) or m.group(2)] + int(m.group(3) or 0))
        elif op == "DW_OP_call_frame_cfa":
            rule = _cfa_rule(path, pc - 1)
            if not rule:
                return None
            stack.append((regs["7"] if rule[0] == "RSP" else regs["6"]) + rule[1])
        elif word in ("DW_OP_consts", "DW_OP_constu") and re.fullmatch(r"[+-]?\d+", arg):
            stack.append(int(arg))
        elif re.fullmatch(r"DW_OP_lit\d+", op):
            stack.append(int(op[len("DW_OP_lit") :]))
        elif word == "DW_OP_plus_uconst" and arg.isdigit() and stack:
            stack[-1] += int(arg)
        elif op in ("DW_OP_plus", "DW_OP_minus") and len(stack) >= 2:
            b, a = stack.pop(), stack.pop()
            stack.append(a + b if op == "DW_OP_plus" else a - b)
        else:
            return None
    return stack[-1] if len(stack) == 1 else None


def frame_locals(path: str, pc: int, sp: int, bp: int, cfi: str | None = None) -> list[Local]:
    """The local variables in memory of the frame that made a call returning to ELF address
    pc of the module at `path`, its stack pointer sp and frame pointer bp at the call: those
    of the function and of its lexical blocks (or inlined functions) around the call whose
    location is one offset from the frame base (DW_OP_fbreg; the frame base being the
    canonical frame address from the call's row of the call frame information, the stack
    pointer or the frame pointer) or from the stack or frame pointer, directly or in the
    entry of a location list that holds the call. [] without debug information; a local
    whose location at the call is anything else (a register) is left out.
    `cfi`: the module whose call frame information to read, when `path` is its separate
    debug file (which has none)."""
    found = _scopes(path, pc)
    if found is None:
        return []
    dies, fortran, scopes = found
    sub = scopes[-1]
    regs = {"6": bp, "7": sp}
    base = _frame_base(sub.attrs.get("DW_AT_frame_base", ""), cfi or path, pc, regs)
    out = []
    for i, scope in enumerate(scopes):
        # The function the scope is in: an inlined one's own name, with its caller's.
        fn = next(f for f in scopes[i:] if f.tag in ("DW_TAG_subprogram", _INLINED))
        function = _region(_function_name(dies, fn))
        if fn.tag == _INLINED and not function.startswith(_REGION):
            function += f" (inlined into {_region(_function_name(dies, sub))})"
        for v, named, name, t in _scope_vars(dies, [scope]):
            # (a location list: its entry at the call, pc - 1, the callee then running)
            loc = _location_at(v.attrs.get("DW_AT_location", "").strip(), pc - 1)
            fm, bm = _FBREG.match(loc), _BREG.match(loc)
            if fm and base is not None:
                lo = base + int(fm.group(1))
            elif bm:
                lo = regs[bm.group(1)] + int(bm.group(2))
            else:
                continue
            size = _size(dies, t, fortran)
            if not name or not size:
                continue
            decl = _decl(dies, named)
            ty = named.attrs.get("DW_AT_type", "")
            tname = ty.split('"', 1)[1].rstrip('"') if '"' in ty else ""
            layout = Layout(name, tname, size, fortran, dies, t, decl)
            out.append(Local(name, function, decl, lo, size, layout))
    return out


class StackLayout:
    """A thread's stack as the report's object, with the locals recorded frames hold: an
    offset into the stack (from `base`, its lowest address) is `sums[1]` inside a local, the
    stack's own name elsewhere. Locals of different frames at the same bytes (a stack reused
    by later calls: a driver calling one function with a parallel region after another) are
    left out of `local(off)`: which one an access reached is not known from its offset. With
    the times the frames were recorded (`times`, one per local), `at(off, times)` tells: the
    local of the frame recorded last before the access."""

    type = ""

    def __init__(self, name: str, base: int, local_vars: list[Local], times: list | None = None):
        self.name = name
        self.base = base
        keep: dict[tuple[int, str], Local] = {}
        for v in local_vars:
            keep.setdefault((v.lo, v.name), v)
        vs = sorted(keep.values(), key=lambda v: v.lo)
        # One sweep: a local that starts before the furthest end so far overlaps the local
        # that ends there (and any other it overlaps is marked in its own turn).
        clash: set[int] = set()
        end, last = -1, -1
        for i, v in enumerate(vs):
            if v.lo < end:
                clash |= {i, last}
            if v.lo + v.size > end:
                end, last = v.lo + v.size, i
        self.locals = [v for k, v in enumerate(vs) if k not in clash]
        self._starts = [v.lo for v in self.locals]
        # Every record of a clashing local, by the time its frame was recorded, with its
        # cluster (the clashing locals that overlap, directly or through others).
        lost = {(vs[k].lo, vs[k].name) for k in clash}
        timed = [(int(t), v) for t, v in zip(times or [], local_vars) if (v.lo, v.name) in lost]
        self.timed = sorted(timed, key=lambda tv: tv[0])
        self._cluster: list[tuple[int, int]] = []  # [lo, hi) of each cluster, by address
        for _t, v in sorted(timed, key=lambda tv: tv[1].lo):
            if self._cluster and v.lo < self._cluster[-1][1]:
                lo, hi = self._cluster[-1]
                self._cluster[-1] = (lo, max(hi, v.lo + v.size))
            else:
                self._cluster.append((v.lo, v.lo + v.size))

    def fields_at(self, off: int, times) -> list[str]:
        """The fields at offset `off` of the locals accesses at `times` reached (at)."""
        return [v.layout.field(self.base + off - v.lo) for v in self.at(off, times)]

    def local(self, off: int) -> Local | None:
        a = self.base + off
        k = bisect.bisect_right(self._starts, a) - 1
        v = self.locals[k] if k >= 0 else None
        return v if v is not None and a < v.lo + v.size else None

    def at(self, off: int, times) -> list[Local]:
        """The locals at offset `off` accessed at `times` (the runtime's ticks, as the
        frames' records; or (tick, the accessing function) pairs): local(off), else, where
        locals clash, for each time the local there of the frame recorded last at or before
        it among those whose locals clash with it (none where that frame has no local at
        `off`, or before the first). An access made by the function whose local one of them
        is (its own prologue zeroing it before its call was recorded) or by an OpenMP region
        outlined from it (`phase_a._omp_fn.0`) is that function's local's, whatever its
        time: a watchpoint's trap or a sample is timed when it is taken, and a frame when its
        call is recorded."""
        v = self.local(off)
        if v is not None or not self.timed:
            return [v] if v is not None else []
        a = self.base + off
        k = bisect.bisect_right(self._cluster, (a, float("inf"))) - 1
        if k < 0 or a >= self._cluster[k][1]:
            return []
        lo, hi = self._cluster[k]
        # The records of the cluster's frames (their times), and each one's local at a.
        t0s = sorted({t0 for t0, w in self.timed if lo <= w.lo < hi})
        there = {t0: w for t0, w in self.timed if w.lo <= a < w.lo + w.size}
        found: dict[tuple, Local] = {}
        for t, fn in sorted({(int(x[0]), x[1] or "") if isinstance(x, tuple) else (int(x), "")
                             for x in times}):  # fmt: skip
            own = [t0 for t0, w in there.items() if fn and _runs_in(fn, w.function)]
            if own:
                before = [t0 for t0 in own if t0 <= t]
                w = there[max(before) if before else min(own)]
            else:
                j = bisect.bisect_right(t0s, t) - 1
                w = there.get(t0s[j]) if j >= 0 else None  # the frame recorded last by then
            if w is not None:
                found.setdefault((w.lo, w.name, w.function), w)
        return list(found.values())

    def field(self, off: int) -> str:
        v = self.local(off)
        return v.layout.field(self.base + off - v.lo) if v else self.name

    def bit_field(self, off: int) -> bool:
        v = self.local(off)
        return v.layout.bit_field(self.base + off - v.lo) if v else False

    def element(self) -> tuple[str, int] | None:
        return None
