// The explain page (see explain_namespace.js), inflate: RFC 1951, raw DEFLATE, as Python's zlib
// writes it with wbits −15, synchronously in the page's own script: the drawing waits on nothing,
// and no browser API is needed. Canonical Huffman codes decoded bit by bit (as zlib's puff.c does).
(function (page) {
  "use strict";
  const LENGTH_BASE = [3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 15, 17, 19, 23, 27, 31, 35, 43, 51, 59, 67, 83, 99, 115, 131,
    163, 195, 227, 258];
  const LENGTH_EXTRA = [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0];
  const DISTANCE_BASE = [1, 2, 3, 4, 5, 7, 9, 13, 17, 25, 33, 49, 65, 97, 129, 193, 257, 385, 513, 769, 1025, 1537,
    2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577];
  const DISTANCE_EXTRA = [0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13];
  const CODE_LENGTH_ORDER = [16, 17, 18, 0, 8, 7, 9, 6, 10, 5, 11, 4, 12, 3, 13, 2, 14, 1, 15];
  function huffman(lengths) { // {counts per code length, symbols in canonical order}
    const counts = new Uint16Array(16), offsets = new Uint16Array(16), symbols = new Uint16Array(lengths.length);
    for (let s = 0; s < lengths.length; s++) counts[lengths[s]]++;
    counts[0] = 0;
    for (let len = 1; len < 16; len++) offsets[len] = offsets[len - 1] + counts[len - 1];
    for (let s = 0; s < lengths.length; s++) if (lengths[s]) symbols[offsets[lengths[s]]++] = s;
    return { counts: counts, symbols: symbols };
  }
  const FIXED = (function () {
    const lengths = new Uint8Array(288);
    lengths.fill(8, 0, 144); lengths.fill(9, 144, 256); lengths.fill(7, 256, 280); lengths.fill(8, 280, 288);
    return { literals: huffman(lengths), distances: huffman(new Uint8Array(30).fill(5)) };
  })();
  function inflate(input, size) {
    const out = new Uint8Array(size);
    let at = 0, pos = 0, buffer = 0, held = 0; // bits not yet used, least significant first
    const bits = function (n) {
      while (held < n) {
        if (pos >= input.length) throw new Error("inflate: the data ends early");
        buffer |= input[pos++] << held;
        held += 8;
      }
      const value = buffer & ((1 << n) - 1);
      buffer >>>= n;
      held -= n;
      return value;
    };
    const decode = function (code) {
      let value = 0, first = 0, index = 0;
      for (let len = 1; len < 16; len++) {
        if (!held) {
          if (pos >= input.length) throw new Error("inflate: the data ends early");
          buffer = input[pos++];
          held = 8;
        }
        value |= buffer & 1;
        buffer >>>= 1;
        held--;
        const count = code.counts[len];
        if (value - first < count) return code.symbols[index + value - first];
        index += count;
        first = (first + count) << 1;
        value <<= 1;
      }
      throw new Error("inflate: a code that is not in the table");
    };
    let final = 0;
    while (!final) {
      final = bits(1);
      const type = bits(2);
      if (type === 0) { // stored: from the next byte boundary (the bits held are the rest of a byte)
        buffer = 0;
        held = 0;
        const length = input[pos] | (input[pos + 1] << 8);
        pos += 4;
        out.set(input.subarray(pos, pos + length), at);
        pos += length;
        at += length;
        continue;
      }
      if (type === 3) throw new Error("inflate: block type 3");
      let literals = FIXED.literals, distances = FIXED.distances;
      if (type === 2) { // dynamic tables
        const nlit = bits(5) + 257, ndist = bits(5) + 1, ncode = bits(4) + 4;
        const codeLengths = new Uint8Array(19);
        for (let i = 0; i < ncode; i++) codeLengths[CODE_LENGTH_ORDER[i]] = bits(3);
        const lengthCode = huffman(codeLengths), lengths = new Uint8Array(nlit + ndist);
        for (let i = 0; i < nlit + ndist;) {
          const symbol = decode(lengthCode);
          if (symbol < 16) { lengths[i++] = symbol; continue; }
          let repeat, value = 0;
          if (symbol === 16) { value = lengths[i - 1]; repeat = 3 + bits(2); }
          else if (symbol === 17) repeat = 3 + bits(3);
          else repeat = 11 + bits(7);
          while (repeat--) lengths[i++] = value;
        }
        literals = huffman(lengths.subarray(0, nlit));
        distances = huffman(lengths.subarray(nlit));
      }
      for (;;) {
        const symbol = decode(literals);
        if (symbol < 256) { out[at++] = symbol; continue; }
        if (symbol === 256) break;
        const length = LENGTH_BASE[symbol - 257] + bits(LENGTH_EXTRA[symbol - 257]);
        const d = decode(distances), distance = DISTANCE_BASE[d] + bits(DISTANCE_EXTRA[d]);
        for (let i = 0; i < length; i++, at++) out[at] = out[at - distance];
      }
    }
    if (at !== size) throw new Error("inflate: " + at + " bytes, not " + size);
    return out;
  }
  page.inflate = inflate;
})(window.tinyformerExplain);
