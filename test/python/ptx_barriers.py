"""A PTX check for CTA barriers under thread-dependent control flow (used by test_ep_barriers.py).

``bar.sync`` is ``barrier.sync.aligned``: every thread of the CTA must execute the *same* barrier
instruction, so a ``bar.sync`` that is control-dependent on a branch whose predicate depends on the thread
index (``%tid``, ``%laneid``, ``%warpid``, or anything computed from them) is undefined behaviour; on an
H200 it deadlocked (bench/NOTES.md: LLVM had duplicated a barrier into both sides of a ``lane < W`` branch).

The analysis is deliberately simple and conservative: taint flows flow-insensitively from the thread
index through every instruction's register operands (loads through tainted addresses included); a
branch is divergent when its predicate is tainted; block B is control-dependent on branch block D when B
post-dominates a successor of D but does not strictly post-dominate D. Paths that end in ``trap`` abort the
kernel and are ignored.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

THREAD_SPECIALS = ("%tid.", "%laneid", "%warpid")
_REG = re.compile(r"%[A-Za-z_][\w.]*")
_LABEL = re.compile(r"^(\$?[A-Za-z_][\w$]*):$")


@dataclass
class Block:
    label: str
    instrs: list[str] = field(default_factory=list)
    succs: list[str] = field(default_factory=list)
    branch_pred: str | None = None  # the predicate of a conditional branch ending the block


def kernel_bodies(ptx: str) -> dict[str, str]:
    """{entry name: body text between its braces}."""
    out = {}
    for m in re.finditer(r"\.entry\s+(\w+)\s*\(", ptx):
        start = ptx.index("{", m.end())
        depth, i = 0, start
        while True:
            if ptx[i] == "{":
                depth += 1
            elif ptx[i] == "}":
                depth -= 1
                if depth == 0:
                    break
            i += 1
        out[m.group(1)] = ptx[start + 1 : i]
    return out


def _statements(body: str) -> list[str]:
    lines = []
    for raw in body.splitlines():
        line = raw.split("//")[0].strip()
        if not line or line.startswith("."):  # declarations (.reg, .shared, .local, ...)
            continue
        if _LABEL.match(line):
            lines.append(line)
            continue
        lines.extend(part.strip() for part in line.split(";") if part.strip())
    return lines


def build_cfg(body: str) -> tuple[list[Block], str]:
    """Basic blocks in order, and the name of the virtual exit block."""
    blocks: list[Block] = [Block("<entry>")]
    for st in _statements(body):
        m = _LABEL.match(st)
        if m:
            blocks.append(Block(m.group(1)))
            continue
        cur = blocks[-1]
        if cur.succs or cur.branch_pred is not None or (cur.instrs and _ends_block(cur.instrs[-1])):
            blocks.append(Block(f"<after {cur.label}>"))
            cur = blocks[-1]
        cur.instrs.append(st)
    exit_name = "<exit>"
    for i, b in enumerate(blocks):
        last = b.instrs[-1] if b.instrs else ""
        nxt = blocks[i + 1].label if i + 1 < len(blocks) else exit_name
        m = re.match(r"^(@!?)(%\w+)\s+bra(?:\.uni)?\s+(\S+)$", last)
        if m:
            b.branch_pred = m.group(2)
            b.succs = [m.group(3), nxt]
        elif re.match(r"^bra(?:\.uni)?\s+(\S+)$", last):
            b.succs = [last.split()[-1]]
        elif any(ins.startswith("trap") for ins in b.instrs):
            b.succs = []  # an error path: the kernel aborts, so it constrains no post-dominance
        elif last.startswith(("ret", "exit")):
            b.succs = [exit_name]
        else:
            b.succs = [nxt]
    return blocks, exit_name


def _ends_block(instr: str) -> bool:
    return bool(re.match(r"^(@!?%\w+\s+)?bra", instr)) or instr.startswith(("ret", "exit"))


def thread_tainted_registers(blocks: list[Block]) -> set[str]:
    instrs = [ins for b in blocks for ins in b.instrs]
    tainted: set[str] = set()
    changed = True
    while changed:
        changed = False
        for ins in instrs:
            if ins.startswith(("@", "bra", "bar", "st.", "ret", "exit", "trap", "fence", "membar", "red.")):
                continue
            parts = ins.split(None, 1)
            if len(parts) < 2:
                continue
            operands = parts[1]
            # destination(s): the first operand (a register, a {vector}, or a|b pair)
            if operands.startswith("{"):
                dst_text, src_text = operands[1:].split("}", 1)
            else:
                dst_text, _, src_text = operands.partition(",")
            dsts = set(_REG.findall(dst_text))
            srcs = set(_REG.findall(src_text))
            thread_src = any(s.startswith(THREAD_SPECIALS) for s in srcs)
            if (thread_src or srcs & tainted) and not dsts <= tainted:
                tainted |= dsts
                changed = True
    return tainted


def _postdominators(blocks: list[Block], exit_name: str) -> dict[str, set[str]]:
    names = [b.label for b in blocks] + [exit_name]
    succ = {b.label: [s for s in b.succs if s in names] for b in blocks} | {exit_name: []}
    pdom = {n: set(names) for n in names}
    pdom[exit_name] = {exit_name}
    changed = True
    while changed:
        changed = False
        for n in names:
            if n == exit_name or not succ[n]:
                continue  # the exit, and trap blocks (post-dominated by everything)
            ss = succ[n]
            new = set.intersection(*(pdom[s] for s in ss)) if ss else set()
            new = new | {n}
            if new != pdom[n]:
                pdom[n] = new
                changed = True
    return pdom


def divergent_barriers(body: str) -> list[str]:
    """Descriptions of every ``bar.sync``/``barrier.sync.aligned`` that is control-dependent on a branch
    whose predicate depends on the thread index (empty: none)."""
    blocks, exit_name = build_cfg(body)
    tainted = thread_tainted_registers(blocks)
    pdom = _postdominators(blocks, exit_name)
    problems = []
    # Dead ends: trap blocks and blocks whose every path leads to one (vacuously post-dominated by all).
    dead = {b.label for b in blocks if not b.succs}
    grew = True
    while grew:
        grew = False
        for b in blocks:
            if b.label not in dead and b.succs and all(x in dead for x in b.succs):
                dead.add(b.label)
                grew = True
    for d in blocks:
        if d.branch_pred is None or d.branch_pred not in tainted:
            continue
        for s in d.succs:
            if s in dead:
                continue
            for b in blocks:
                if not any(re.match(r"^(bar\.sync|barrier\.sync\.aligned|barrier\.cta\.sync\.aligned)", i) for i in b.instrs):
                    continue
                # b is control-dependent on d through s
                if b.label in pdom.get(s, set()) and not (b.label in pdom[d.label] and b.label != d.label):
                    problems.append(f"barrier in block {b.label} depends on the thread-dependent branch on "
                                    f"{d.branch_pred} ending block {d.label}")  # fmt: skip
    return sorted(set(problems))
