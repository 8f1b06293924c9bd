"""The fragment layouts of the PTX ISA, written out as the ISA states them, so that the tests hold
the instructions (through the CPU emulation, or on the hardware) against the specification and
not against the formulas of the emulation or of a kernel (which a consistent misreading would
pass).

Sources (PTX ISA 9.0):
  - 9.7.14.5.8 "Matrix Fragments for mma.m16n8k16 with floating point type": multiplicands A and
    B ``.f16``/``.bf16`` (each ``.f16x2`` register holds two elements, "low to high"), accumulators
    C and D ``.f32``;
  - 9.7.14.5.15 "Warp-level matrix load instruction: ldmatrix": ``.m8n8`` with ``.x1``, ``.x2``,
    ``.x4`` and ``.trans``, and its Figure 104 (the fragment layout of one 8x8 matrix).
Each formula below is the ISA's, in its own names (groupID, threadID_in_group, ai, bi, ci).
"""

import numpy

LANES = 32


def group_id(laneid):
    """groupID = %laneid >> 2"""
    return laneid >> 2


def thread_id_in_group(laneid):
    """threadID_in_group = %laneid % 4"""
    return laneid % 4


# ------------------------------------------------------------------------ mma.m16n8k16, .f16/.bf16
def a_position(laneid, i):
    """(row, col) in A (16x16) of element ai (i = 0..7) of lane ``laneid``:

        row =      groupID            for ai where  0 <= i < 2 || 4 <= i < 6
                  groupID + 8         Otherwise

        col =  (threadID_in_group * 2) + (i & 0x1)          for ai where i <  4
               (threadID_in_group * 2) + (i & 0x1) + 8      for ai where i >= 4
    """
    groupID, threadID_in_group = group_id(laneid), thread_id_in_group(laneid)
    row = groupID if (0 <= i < 2 or 4 <= i < 6) else groupID + 8
    col = (threadID_in_group * 2) + (i & 0x1) if i < 4 else (threadID_in_group * 2) + (i & 0x1) + 8
    return row, col


def b_position(laneid, i):
    """(row, col) in B (16x8) of element bi (i = 0..3) of lane ``laneid``:

        row =  (threadID_in_group * 2) + (i & 0x1)           for bi where i <  2
               (threadID_in_group * 2) + (i & 0x1) + 8       for bi where i >= 2

        col = groupID
    """
    groupID, threadID_in_group = group_id(laneid), thread_id_in_group(laneid)
    row = (threadID_in_group * 2) + (i & 0x1) if i < 2 else (threadID_in_group * 2) + (i & 0x1) + 8
    col = groupID
    return row, col


def c_position(laneid, i):
    """(row, col) in C or D (16x8) of element ci (i = 0..3, one .f32 register each) of lane ``laneid``:

        row =      groupID                               for ci where i <  2
                 groupID + 8                             for ci where i >= 2

        col =  (threadID_in_group * 2) + (i & 0x1)        for ci where i = {0,..,3}
    """
    groupID, threadID_in_group = group_id(laneid), thread_id_in_group(laneid)
    row = groupID if i < 2 else groupID + 8
    col = (threadID_in_group * 2) + (i & 0x1)
    return row, col


def _places(position, elements):
    """(rows, cols), each (32, elements): where element i of lane laneid sits, by ``position``."""
    places = numpy.array([[position(laneid, i) for i in range(elements)] for laneid in range(LANES)])
    return places[..., 0], places[..., 1]


def _pack_halves(matrix_bits, position, elements):
    """Registers (..., 32 lanes, elements/2; uint32) holding the 16-bit ``matrix_bits`` (..., rows,
    cols) by ``position``: element 2r in the low half of register r, element 2r + 1 in the high
    half ("low to high")."""
    rows, cols = _places(position, elements)
    held = numpy.asarray(matrix_bits, dtype=numpy.uint16).astype(numpy.uint32)[..., rows, cols]
    return held[..., 0::2] | (held[..., 1::2] << numpy.uint32(16))


def pack_a(a_bits):
    """A's four .f16x2 registers per lane, (..., 32, 4) uint32, from the bit patterns of A (..., 16, 16)."""
    return _pack_halves(a_bits, a_position, 8)


def pack_b(b_bits):
    """B's two .f16x2 registers per lane, (..., 32, 2) uint32, from the bit patterns of B (..., 16, 8)."""
    return _pack_halves(b_bits, b_position, 4)


def pack_c(c):
    """C's four .f32 registers per lane, (..., 32, 4) float32, from C (..., 16, 8) float32."""
    rows, cols = _places(c_position, 4)
    return numpy.ascontiguousarray(numpy.asarray(c, dtype=numpy.float32)[..., rows, cols])


def unpack_d(d_registers):
    """D (..., 16, 8) from its four .f32 registers per lane (..., 32, 4); a place no register
    holds would stay NaN."""
    d_registers = numpy.asarray(d_registers, dtype=numpy.float32)
    rows, cols = _places(c_position, 4)
    d = numpy.full(d_registers.shape[:-2] + (16, 8), numpy.nan, dtype=numpy.float32)
    d[..., rows, cols] = d_registers
    return d


# ------------------------------------------------------------------------ ldmatrix .m8n8 .b16
# "The eight addresses required for each matrix are provided by eight threads, depending upon the
# value of .num": .x1 threads 0-7 (addr0-addr7), .x2 threads 0-15, .x4 threads 0-31; "addresses
# addr0-addr7 correspond to the rows of the first matrix, addresses addr8-addr15 correspond to the
# rows of the second matrix, and so on", and "consecutive instances of row need not be stored
# contiguously in memory". Figure 104: "a group of four threads loads an entire row": lane laneid
# receives, in its register m, row groupID, elements 2·threadID_in_group and 2·threadID_in_group + 1
# of matrix m, the first in the low half. ".trans indicates that the matrix is loaded in
# column-major format": the same places of the transposed matrix.
def ldmatrix_registers(memory_rows, row_addresses, num, trans):
    """The registers (32 lanes × 4, uint32; those past ``num`` 0) that ldmatrix.m8n8.x{num}[.trans].b16
    gives when lane t passes the address of row ``row_addresses[t]`` of ``memory_rows`` (16-bit
    bit patterns, 8 per row)."""
    rows = numpy.asarray(memory_rows, dtype=numpy.uint16).astype(numpy.uint32)
    registers = numpy.zeros((LANES, 4), dtype=numpy.uint32)
    for laneid in range(LANES):
        for m in range(num):
            matrix = rows[[row_addresses[8 * m + r] for r in range(8)]]  # addr(8m) .. addr(8m + 7)
            if trans:
                matrix = matrix.T
            row = group_id(laneid)
            for i in range(2):
                col = thread_id_in_group(laneid) * 2 + i
                registers[laneid, m] |= matrix[row, col] << numpy.uint32(16 * i)
    return registers
