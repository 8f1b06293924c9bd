// The explain page: draws the data that tinyformer.study.viz.explanation computed (the JSON in
// #explain-data) and checks it. The Python side stores what cannot be recomputed (P, Q, K, V,
// dO per head, each token's dℓₜ/dP) compactly; this script derives the rest of attention's
// backward from them in float64 and its self-test compares a sample with Python's float64 values.
(function () {
  "use strict";
  const CANVAS_ABOVE = 64; // a heatmap with more rows or columns than this is drawn on a canvas
  const started = performance.now();
  const data = JSON.parse(document.getElementById("explain-data").textContent);
  const KINDS = Object.keys(data.kinds);
  // A page of several checkpoints of one run (`tinyformer explain --checkpoints`) holds what changes
  // with training (the loss, the token gradients, the check, the arrays and samples) once per step in
  // data.steps, and what does not (tokens, shapes, the model) once. A page of one checkpoint is its
  // own only step. `view` is the step shown; the slider changes it.
  const STEPS = data.steps || [data];
  let current = STEPS.length - 1, view = STEPS[current];
  const GRADS = { dP: "dL/dP", dS: "dL/dS" };

  // ------------------------------------------------------------------ arrays
  // The page stores what cannot be recomputed (tinyformer.study.viz.explain_codec): P, Q, K, V and dO of
  // every head as float16 scaled per head by a power of two, each token's dℓₜ/dP in one byte a value
  // (log8), the small arrays as float32. It derives the rest here, in float64, as the backward of
  // attention does (explain_codec.recompute is the same in Python): dP = dO·Vᵀ, dS (softmax's
  // backward), dQ = dS·K/√d_k, dK = dSᵀ·Q/√d_k, dV = Pᵀ·dO, and each token's dℓₜ/dS.
  const HALF = new Float64Array(65536), HALF_ERROR = new Float64Array(65536);
  for (let h = 0; h < 65536; h++) {
    const e = (h >> 10) & 31, m = h & 1023;
    const v = e === 0 ? m * Math.pow(2, -24) : e === 31 ? (m ? NaN : Infinity) : (1024 + m) * Math.pow(2, e - 25);
    HALF[h] = h & 32768 ? -v : v;
    HALF_ERROR[h] = e === 0 ? Math.pow(2, -25) : Math.pow(2, e - 26); // half a unit in the last place
  }
  const LOG8 = new Float64Array(256);
  // Inflate (RFC 1951, raw DEFLATE, as Python's zlib writes it with wbits −15), synchronously in
  // the page's own script: the drawing waits on nothing, and no browser API is needed. Canonical
  // Huffman codes decoded bit by bit (as zlib's puff.c does).
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
  // An entry's bytes: base64, inflated, and its byte planes (every value's first byte, then every
  // second, ...) put back together.
  function bytesOf(entry) {
    const text = atob(entry.base64);
    const packed = new Uint8Array(text.length);
    for (let i = 0; i < text.length; i++) packed[i] = text.charCodeAt(i);
    const planes = inflate(packed, entry.bytes), width = entry.deflate, count = planes.length / width;
    if (width === 1) return planes;
    const bytes = new Uint8Array(planes.length);
    for (let b = 0; b < width; b++) for (let i = 0; i < count; i++) bytes[i * width + b] = planes[b * count + i];
    return bytes;
  }
  function stridesOf(shape) {
    const strides = [];
    let size = 1;
    for (let axis = shape.length - 1; axis >= 0; axis--) {
      strides[axis] = size;
      size *= shape[axis];
    }
    return { strides: strides, size: size };
  }
  // {shape, strides, values, error}: the stored numbers in float64 and the most each may be off.
  function decodeArray(entry, positions, bytes) {
    const layout = stridesOf(entry.shape), size = layout.size;
    const values = new Float64Array(size), error = new Float64Array(size);
    if (entry.encoding === "float32") {
      values.set(new Float32Array(bytes.buffer, 0, size));
      for (let i = 0; i < size; i++) error[i] = Math.max(Math.abs(values[i]) * Math.pow(2, -23), Math.pow(2, -150));
    } else if (entry.encoding === "float16") {
      // With `causal`, a block stores its lower triangle only (row by row); the rest is exactly 0.
      const n = entry.causal ? entry.shape[entry.shape.length - 1] : 0, blocks = entry.exponents.length;
      const per = size / blocks, halves = new Uint16Array(bytes.buffer, 0, bytes.length / 2);
      let k = 0;
      for (let b = 0; b < blocks; b++) {
        const scale = Math.pow(2, entry.exponents[b]);
        for (let i = 0; i < per; i++) {
          if (n && i % n > Math.floor(i / n)) continue;
          values[b * per + i] = HALF[halves[k]] * scale;
          error[b * per + i] = HALF_ERROR[halves[k]] * scale;
          k++;
        }
      }
    } else if (entry.encoding === "log8") {
      const [tokens, layers, heads, rows, cols] = entry.shape;
      const relative = Math.pow(2, 0.5 / entry.steps) - 1;
      for (let k = 0; k < 256; k++) LOG8[k] = (k & 127) ? (k & 128 ? -1 : 1) * Math.pow(2, -((k & 127) - 1) / entry.steps) : 0;
      let offset = 0, index = 0;
      for (let t = 0; t < tokens; t++) {
        const kept = entry.causal ? positions[t] + 1 : rows;
        for (let b = 0; b < layers * heads; b++, index++) {
          const scale = Math.pow(2, entry.exponents[index]), floor = scale * Math.pow(2, -(126.5 / entry.steps));
          const base = (t * layers * heads + b) * rows * cols;
          for (let i = 0; i < kept * cols; i++) {
            const v = LOG8[bytes[offset + i]] * scale;
            values[base + i] = v;
            error[base + i] = v ? Math.abs(v) * relative : floor;
          }
          for (let i = kept * cols; i < rows * cols; i++) error[base + i] = 0; // rows after the token: exactly 0
          offset += kept * cols;
        }
      }
    } else {
      throw new Error("unknown array encoding " + entry.encoding);
    }
    return { shape: entry.shape, strides: layout.strides, values: values, error: error };
  }
  const tokenPositions = view.token_gradients.positions.map(function (t) { return t - 1; });
  let arrays = {};

  // The contiguous block of a stored array `name` at the leading indices `index` (all of it for []).
  function slice(array, index, field) {
    let offset = 0;
    index.forEach(function (i, axis) { offset += i * array.strides[axis]; });
    const size = index.length ? array.strides[index.length - 1] : array[field].length;
    return array[field].subarray(offset, offset + size);
  }
  function stored(name, index) { return slice(arrays[name], index, "values"); }
  function storedError(name, index) { return slice(arrays[name], index, "error"); }

  // P of a head as the page computes with it: each stored row divided by its sum (float16 rows sum
  // to 1 only to their precision; explain_codec.normalised_rows).
  let derived = {};
  const stepArrays = [], stepDerived = [];
  // Show step k's numbers: its arrays decoded once, when first shown, and its own computed blocks.
  function useStep(k) {
    current = k;
    view = STEPS[k];
    if (!stepArrays[k]) {
      const decoded = {};
      for (const name of Object.keys(view.arrays)) {
        decoded[name] = decodeArray(view.arrays[name], tokenPositions, bytesOf(view.arrays[name]));
      }
      stepArrays[k] = decoded;
      stepDerived[k] = {};
    }
    arrays = stepArrays[k];
    derived = stepDerived[k];
  }
  function cached(key, make) { return derived[key] || (derived[key] = make()); }
  function probabilitiesOf(kind, l, h) {
    return cached("P." + kind + "." + l + "." + h, function () {
      const info = data.kinds[kind], raw = stored("P." + kind, [l, h]), out = new Float64Array(raw.length);
      for (let i = 0; i < info.rows; i++) {
        let s = 0;
        for (let j = 0; j < info.cols; j++) s += raw[i * info.cols + j];
        for (let j = 0; j < info.cols; j++) out[i * info.cols + j] = s > 0 ? raw[i * info.cols + j] / s : 0;
      }
      return out;
    });
  }
  // c = a·bᵀ for a (n × d), b (m × d): (n × m); with `transposeA`, aᵀ·b for a (k × n), b (k × m).
  function matmulT(a, b, n, m, d) {
    const c = new Float64Array(n * m);
    for (let i = 0; i < n; i++) {
      for (let j = 0; j < m; j++) {
        let s = 0;
        for (let k = 0; k < d; k++) s += a[i * d + k] * b[j * d + k];
        c[i * m + j] = s;
      }
    }
    return c;
  }
  function matmulTA(a, b, k, n, m) {
    const c = new Float64Array(n * m);
    for (let r = 0; r < k; r++) {
      for (let i = 0; i < n; i++) {
        const x = a[r * n + i];
        if (x === 0) continue;
        for (let j = 0; j < m; j++) c[i * m + j] += x * b[r * m + j];
      }
    }
    return c;
  }
  // dS = P∘(dP − rowsum(P∘dP)) row by row, dP centred at the row's most probable key m first (as
  // Σ_j P_ij = 1 this changes nothing, but nothing of dP's size cancels: a saturated row keeps
  // its tiny true values; explain_codec.softmax_backward).
  function softmaxBackward(P, dP, rows, cols) {
    const dS = new Float64Array(rows * cols);
    for (let i = 0; i < rows; i++) {
      const o = i * cols;
      let m = 0;
      for (let j = 1; j < cols; j++) if (P[o + j] > P[o + m]) m = j;
      const centre = dP[o + m];
      let r = 0;
      for (let j = 0; j < cols; j++) r += P[o + j] * (dP[o + j] - centre);
      for (let j = 0; j < cols; j++) dS[o + j] = P[o + j] * ((dP[o + j] - centre) - r);
    }
    return dS;
  }
  function headGradient(name, kind, l, h) {
    return cached(name + "." + kind + "." + l + "." + h, function () {
      const info = data.kinds[kind], dk = data.model.d_k, rows = info.rows, cols = info.cols;
      if (name === "dP") return matmulT(stored("dO." + kind, [l, h]), stored("V." + kind, [l, h]), rows, cols, dk);
      const scale = 1 / Math.sqrt(dk), P = probabilitiesOf(kind, l, h);
      const dS = softmaxBackward(P, headGradient("dP", kind, l, h), rows, cols);
      if (name === "dS") return dS;
      if (name === "dV") return matmulTA(P, stored("dO." + kind, [l, h]), rows, cols, dk);
      const out = name === "dQ" ? matmulTA(transpose(dS, rows, cols), stored("K." + kind, [l, h]), cols, rows, dk)
        : matmulTA(dS, stored("Q." + kind, [l, h]), rows, cols, dk);
      for (let i = 0; i < out.length; i++) out[i] *= scale;
      return out;
    });
  }
  function transpose(a, rows, cols) {
    const t = new Float64Array(a.length);
    for (let i = 0; i < rows; i++) for (let j = 0; j < cols; j++) t[j * rows + i] = a[i * cols + j];
    return t;
  }
  function tokenGradient(name, kind, ti, l, h) {
    if (name === "dP") return stored("token.dP." + kind, [ti, l, h]);
    return cached("token.dS." + kind + "." + ti + "." + l + "." + h, function () {
      const info = data.kinds[kind];
      return softmaxBackward(probabilitiesOf(kind, l, h), stored("token.dP." + kind, [ti, l, h]), info.rows, info.cols);
    });
  }
  // What the panels read: `name` at the leading indices `index`. P, dP, dS, dQ, dK, dV at [layer, head]
  // and token.dP, token.dS at [token index, layer, head] are the page's own; the rest is stored.
  const DERIVED = { dP: 1, dS: 1, dQ: 1, dK: 1, dV: 1 };
  function block(name, index) {
    const [quantity, kind] = name.split(".");
    if (quantity === "P") return probabilitiesOf(kind, index[0], index[1]);
    if (quantity in DERIVED) return headGradient(quantity, kind, index[0], index[1]);
    if (quantity === "token" && (kind === "dP" || kind === "dS")) {
      return tokenGradient(kind, name.split(".")[2], index[0], index[1], index[2]);
    }
    return stored(name, index);
  }
  // Every head of `name` (P, dP, ... or token.dP, token.dS) in one array, as the Python side's.
  function whole(name) {
    const parts = name.split("."), token = parts[0] === "token", kind = parts[parts.length - 1];
    const info = data.kinds[kind], tokens = token ? tokenPositions.length : 1, out = [];
    for (let t = 0; t < tokens; t++) {
      for (let l = 0; l < info.layers; l++) {
        for (let h = 0; h < info.heads; h++) out.push(token ? block(name, [t, l, h]) : block(name, [l, h]));
      }
    }
    const size = out.reduce(function (s, a) { return s + a.length; }, 0), all = new Float64Array(size);
    let offset = 0;
    out.forEach(function (a) { all.set(a, offset); offset += a.length; });
    return all;
  }

  const pieces = { source: data.source.pieces, target: data.target.inputs };
  const outputs = data.target.outputs;
  const rowLabels = function (kind) { return pieces[data.kinds[kind].queries]; };
  const colLabels = function (kind) { return pieces[data.kinds[kind].keys]; };
  const tokenIndex = {}; // target position (1-based) -> index in the token.* arrays
  view.token_gradients.positions.forEach(function (t, i) { tokenIndex[t] = i; });

  // ------------------------------------------------------------------ numbers and colours
  function fmt(v) {
    if (v === 0) return "0";
    if (!isFinite(v)) return String(v);
    const a = Math.abs(v);
    return a >= 1e-3 && a < 1e4 ? v.toPrecision(4) : v.toExponential(3);
  }
  function escapeText(text) {
    return String(text).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");
  }
  const VIRIDIS = [[68, 1, 84], [72, 40, 120], [62, 74, 137], [49, 104, 142], [38, 130, 142], [31, 158, 137],
    [53, 183, 121], [109, 205, 89], [180, 222, 44], [253, 231, 37]];
  function between(a, b, t) { return [0, 1, 2].map(function (i) { return Math.round(a[i] + (b[i] - a[i]) * t); }); }
  function stops(list, t) {
    const x = Math.min(Math.max(t, 0), 1) * (list.length - 1);
    const i = Math.min(Math.floor(x), list.length - 2);
    return between(list[i], list[i + 1], x - i);
  }
  function hex(rgb) { return "#" + rgb.map(function (c) { return c.toString(16).padStart(2, "0"); }).join(""); }
  const SEQUENTIAL = [], DIVERGING = [];
  for (let i = 0; i < 256; i++) {
    SEQUENTIAL.push(stops(VIRIDIS, i / 255));
    const t = i / 255 * 2 - 1; // blue (negative), white (0), red (positive)
    DIVERGING.push(t < 0 ? between([255, 255, 255], [33, 102, 172], -t) : between([255, 255, 255], [178, 24, 43], t));
  }
  const SEQUENTIAL_HEX = SEQUENTIAL.map(hex), DIVERGING_HEX = DIVERGING.map(hex);
  function colourIndex(v, scale, vmax) {
    const t = scale === "sequential" ? v / vmax : (v / vmax + 1) / 2;
    return Math.min(255, Math.max(0, Math.round((isFinite(t) ? t : 0.5) * 255)));
  }
  function maxAbs(values) {
    let m = 0;
    for (let i = 0; i < values.length; i++) m = Math.max(m, Math.abs(values[i]));
    return m;
  }

  // ------------------------------------------------------------------ figures: one layout, two painters
  // A Figure holds heatmaps, rectangles and text; toSVG() writes it as SVG markup (one <rect
  // class="cell"> per heatmap entry, its value in data-v) and draw(canvas) paints it.
  function Figure(width, height) {
    this.width = Math.ceil(width);
    this.height = Math.ceil(height);
    this.items = [];
  }
  Figure.prototype.heatmap = function (x, y, cell, spec) {
    const item = Object.assign({ type: "heatmap", x: x, y: y, cell: cell }, spec);
    this.items.push(item);
    return item;
  };
  Figure.prototype.rect = function (x, y, w, h, fill, extra) {
    this.items.push({ type: "rect", x: x, y: y, w: w, h: h, fill: fill, extra: extra || "" });
  };
  Figure.prototype.outline = function (x, y, w, h, colour) {
    this.items.push({ type: "outline", x: x, y: y, w: w, h: h, colour: colour });
  };
  Figure.prototype.text = function (x, y, text, options) {
    this.items.push(Object.assign({ type: "text", x: x, y: y, text: text, size: 11, anchor: "start", rotate: false,
      fill: "#1d2433" }, options || {}));
  };
  Figure.prototype.hit = function (x, y) {
    for (const item of this.items) {
      if (item.type !== "heatmap") continue;
      const c = Math.floor((x - item.x) / item.cell), r = Math.floor((y - item.y) / item.cell);
      if (r >= 0 && c >= 0 && r < item.rows && c < item.cols) return { item: item, r: r, c: c };
    }
    return null;
  };
  Figure.prototype.toSVG = function (attributes) {
    const parts = ['<svg width="' + this.width + '" height="' + this.height + '" viewBox="0 0 ' + this.width + " " +
      this.height + '" shape-rendering="crispEdges" ' + (attributes || "") + ">"];
    for (const item of this.items) {
      if (item.type === "heatmap") {
        const colours = item.scale === "sequential" ? SEQUENTIAL_HEX : DIVERGING_HEX;
        const q = item.quantity ? ' data-q="' + item.quantity + '"' : "";
        for (let r = 0; r < item.rows; r++) {
          for (let c = 0; c < item.cols; c++) {
            const v = item.values[r * item.cols + c];
            parts.push('<rect class="cell" x="' + (item.x + c * item.cell) + '" y="' + (item.y + r * item.cell) +
              '" width="' + item.cell + '" height="' + item.cell + '" fill="' +
              colours[colourIndex(v, item.scale, item.vmax)] + '" data-r="' + r + '" data-c="' + c + '" data-v="' +
              v + '"' + q + "></rect>");
          }
        }
        parts.push('<rect x="' + item.x + '" y="' + item.y + '" width="' + item.cols * item.cell + '" height="' +
          item.rows * item.cell + '" fill="none" stroke="#9aa3b5" stroke-width="0.5"></rect>');
      } else if (item.type === "outline") {
        parts.push('<rect x="' + item.x + '" y="' + item.y + '" width="' + item.w + '" height="' + item.h +
          '" fill="none" stroke="' + item.colour + '" stroke-width="2"></rect>');
      } else if (item.type === "rect") {
        parts.push('<rect x="' + item.x + '" y="' + item.y + '" width="' + item.w + '" height="' + item.h +
          '" fill="' + item.fill + '" ' + item.extra + "></rect>");
      } else {
        const turn = item.rotate ? ' transform="rotate(-90 ' + item.x + " " + item.y + ')"' : "";
        parts.push('<text x="' + item.x + '" y="' + item.y + '" font-size="' + item.size + '" font-family="sans-serif"' +
          ' text-anchor="' + item.anchor + '" fill="' + item.fill + '"' + (item.bold ? ' font-weight="bold"' : "") +
          turn + ">" + escapeText(item.text) + "</text>");
      }
    }
    parts.push("</svg>");
    return parts.join("");
  };
  Figure.prototype.draw = function (canvas) {
    canvas.width = this.width;
    canvas.height = this.height;
    const context = canvas.getContext("2d");
    context.fillStyle = "#ffffff";
    context.fillRect(0, 0, this.width, this.height);
    for (const item of this.items) {
      if (item.type === "heatmap") {
        const colours = item.scale === "sequential" ? SEQUENTIAL : DIVERGING;
        const image = context.createImageData(item.cols, item.rows);
        for (let i = 0; i < item.rows * item.cols; i++) {
          const rgb = colours[colourIndex(item.values[i], item.scale, item.vmax)];
          image.data.set([rgb[0], rgb[1], rgb[2], 255], 4 * i);
        }
        const small = document.createElement("canvas");
        small.width = item.cols;
        small.height = item.rows;
        small.getContext("2d").putImageData(image, 0, 0);
        context.imageSmoothingEnabled = false;
        context.drawImage(small, item.x, item.y, item.cols * item.cell, item.rows * item.cell);
      } else if (item.type === "outline") {
        context.strokeStyle = item.colour;
        context.lineWidth = 2;
        context.strokeRect(item.x, item.y, item.w, item.h);
      } else if (item.type === "rect") {
        context.fillStyle = item.fill;
        context.fillRect(item.x, item.y, item.w, item.h);
      } else {
        context.save();
        context.fillStyle = item.fill;
        context.font = (item.bold ? "bold " : "") + item.size + "px sans-serif";
        context.textAlign = item.anchor === "middle" ? "center" : item.anchor;
        context.translate(item.x, item.y);
        if (item.rotate) context.rotate(-Math.PI / 2);
        context.fillText(item.text, 0, 0);
        context.restore();
      }
    }
  };
  // Puts the figure into `container`: SVG markup, or a canvas when it is large.
  function place(container, figure, large, attributes) {
    container.textContent = "";
    if (large) {
      const canvas = document.createElement("canvas");
      canvas.className = "heatmap";
      figure.draw(canvas);
      container.appendChild(canvas);
      return canvas;
    }
    container.innerHTML = figure.toSVG('class="heatmap" ' + (attributes || ""));
    return container.firstElementChild;
  }
  function isLarge(rows, cols) { return Math.max(rows, cols) > CANVAS_ABOVE; }

  // A heatmap with its token labels, title and colour legend, at (x, y) of a figure.
  function labelledHeatmap(figure, x, y, spec) {
    const labels = spec.cell >= 7;
    const size = Math.min(11, spec.cell - 1);
    const room = function (list) { // pixels for the longest label, about 0.62 em a character
      return 6 + Math.min(16, list.reduce(function (m, s) { return Math.max(m, String(s).length); }, 1)) * size * 0.62;
    };
    const left = spec.rowLabels && labels ? room(spec.rowLabels) : 0;
    const top = labels ? room(spec.colLabels) : 0;
    figure.text(x + left, y + 13, spec.title, { size: 12, bold: true });
    const item = figure.heatmap(x + left, y + 22 + top, spec.cell, spec);
    if (labels) {
      if (spec.rowLabels) {
        spec.rowLabels.forEach(function (label, r) {
          figure.text(x + left - 4, item.y + r * spec.cell + spec.cell * 0.75, label, { size: size, anchor: "end" });
        });
      }
      spec.colLabels.forEach(function (label, c) {
        figure.text(item.x + c * spec.cell + spec.cell * 0.75, item.y - 4, label, { size: size, rotate: true });
      });
    }
    const legendY = item.y + spec.rows * spec.cell + 10;
    const width = Math.max(120, Math.min(spec.cols * spec.cell, 240));
    for (let i = 0; i < 64; i++) {
      const t = i / 63;
      const colours = spec.scale === "sequential" ? SEQUENTIAL_HEX : DIVERGING_HEX;
      figure.rect(item.x + t * (width - width / 64), legendY, width / 64 + 0.5, 8, colours[Math.round(t * 255)]);
    }
    const low = spec.scale === "sequential" ? 0 : -spec.vmax;
    figure.text(item.x, legendY + 20, fmt(low), { size: 10 });
    figure.text(item.x + width, legendY + 20, fmt(spec.vmax), { size: 10, anchor: "end" });
    const titleWidth = spec.title.length * 7.2;
    return { item: item, width: left + Math.max(spec.cols * spec.cell, width, titleWidth), height: legendY + 24 - y };
  }

  // ------------------------------------------------------------------ state and the URL hash
  let wantedStep = current; // the hash's step= (its index in STEPS)
  const state = { kind: view.check.head.kind, layer: view.check.head.layer, head: view.check.head.head, grad: "dP",
    token: 0, row: 0 };
  function readHash() {
    const params = new URLSearchParams(location.hash.replace(/^#/, ""));
    const kind = params.get("kind");
    if (KINDS.indexOf(kind) >= 0) state.kind = kind;
    const info = data.kinds[state.kind];
    const whole = function (name, low, high) {
      const v = Number(params.get(name));
      return params.has(name) && Number.isInteger(v) && v >= low && v <= high ? v : null;
    };
    state.layer = whole("layer", 1, info.layers) || Math.min(state.layer, info.layers);
    state.head = whole("head", 1, info.heads) || Math.min(state.head, info.heads);
    if (GRADS[params.get("grad")]) state.grad = params.get("grad");
    state.token = params.get("token") === "all" ? 0 : whole("token", 1, outputs.length) || state.token;
    state.row = whole("row", 1, info.rows) || 0;
    const step = STEPS.map(function (s) { return String(s.step); }).indexOf(params.get("step"));
    wantedStep = step >= 0 ? step : current;
  }
  function writeHash() {
    const text = "kind=" + state.kind + "&layer=" + state.layer + "&head=" + state.head + "&grad=" + state.grad +
      (state.token ? "&token=" + state.token : "") + (state.row ? "&row=" + state.row : "") +
      (STEPS.length > 1 ? "&step=" + view.step : "");
    try {
      history.replaceState(null, "", "#" + text);
    } catch (error) {
      location.hash = text;
    }
  }
  function select(changes) {
    Object.assign(state, changes);
    const info = data.kinds[state.kind];
    state.layer = Math.min(state.layer, info.layers);
    state.head = Math.min(state.head, info.heads);
    if (state.row > info.rows) state.row = 0;
    writeHash();
    update();
  }

  // The gradient `grad` ("dP" or "dS") of the current source (whole loss or token) at (kind, layer, head),
  // or null when the page does not hold that token's own gradients.
  function gradient(grad, kind, layer, head, token) {
    if (!token) return block(grad + "." + kind, [layer - 1, head - 1]);
    if (!(token in tokenIndex)) return null;
    return block("token." + grad + "." + kind, [tokenIndex[token], layer - 1, head - 1]);
  }
  function probabilities(kind, layer, head) { return block("P." + kind, [layer - 1, head - 1]); }
  function sourceName(token) {
    return token ? "ℓ" + token + " (the loss of y" + token + " = " + outputs[token - 1] + ")" : "the whole loss L";
  }

  // ------------------------------------------------------------------ header and controls
  function summary() {
    const m = data.model;
    document.getElementById("summary").textContent = "Model: " + m.layers + " layers, d_model " + m.d_model +
      ", " + m.heads + " heads (d_k " + m.d_k + "), d_ff " + m.d_ff + ", vocabulary " + m.vocabulary + ", " +
      m.parameters.toLocaleString("en") + " parameters. Target " + (data.target.decoding ?
      "translated by the model (" + data.target.decoding + ")" : "given as a reference") +
      ", teacher-forced: L = Σₜ −log p(yₜ | y₍<t₎, x) = " + fmt(view.loss.total) + " over " + outputs.length +
      " target tokens (no label smoothing)." + (STEPS.length > 1 ? " Step " + view.step + " of the run (" +
      view.checkpoint + ")." : "");
  }
  function header() {
    document.getElementById("target-label").textContent = data.target.given;
    summary();
    document.getElementById("about").textContent = data.generator + " · data schema " + data.schema + " version " +
      data.version + " (the JSON in the element explain-data: P, Q, K, V, dO of every head as float16 scaled per head, " +
      "each token's dℓₜ/dP in one byte a value, the rest float32; this page computes dP, dS, dQ, dK, dV from them " +
      "in float64) · " +
      "offline by construction: its Content-Security-Policy forbids every request.";
    const buttons = document.getElementById("kind-buttons");
    KINDS.forEach(function (kind) {
      const button = document.createElement("button");
      button.type = "button";
      button.className = "kind";
      button.dataset.kind = kind;
      button.textContent = data.kinds[kind].name;
      button.addEventListener("click", function () { select({ kind: kind }); });
      buttons.appendChild(button);
    });
    document.getElementById("layer-select").addEventListener("change", function (e) {
      select({ layer: Number(e.target.value) });
    });
    document.getElementById("head-select").addEventListener("change", function (e) {
      select({ head: Number(e.target.value) });
    });
    document.querySelectorAll('input[name="grad"]').forEach(function (input) {
      input.addEventListener("change", function () { select({ grad: input.value }); });
    });
    document.getElementById("export-svg").addEventListener("click", function () {
      download(new Blob([exportSVG()], { type: "image/svg+xml" }), exportName("svg"));
    });
    document.getElementById("export-png").addEventListener("click", function () {
      exportCanvas().toBlob(function (blob) { download(blob, exportName("png")); }, "image/png");
    });
  }
  function controls() {
    document.querySelectorAll("button.kind").forEach(function (b) {
      b.setAttribute("aria-pressed", String(b.dataset.kind === state.kind));
    });
    const info = data.kinds[state.kind];
    [["layer-select", info.layers, state.layer], ["head-select", info.heads, state.head]].forEach(function (s) {
      const element = document.getElementById(s[0]);
      if (element.options.length !== s[1]) {
        element.textContent = "";
        for (let i = 1; i <= s[1]; i++) element.add(new Option(String(i), String(i)));
      }
      element.value = String(s[2]);
    });
    document.querySelectorAll('input[name="grad"]').forEach(function (input) { input.checked = input.value === state.grad; });
  }

  // ------------------------------------------------------------------ 1. overview
  function overview() {
    const container = document.getElementById("overview");
    KINDS.forEach(function (kind) {
      const info = data.kinds[kind];
      const section = document.createElement("div");
      section.className = "kind-block";
      const title = document.createElement("h3");
      title.textContent = info.name + ": " + info.layers + " layers × " + info.heads + " heads, " + info.rows +
        " queries (" + info.queries + ") × " + info.cols + " keys (" + info.keys + ")";
      section.appendChild(title);
      const grid = document.createElement("div");
      grid.className = "grid";
      grid.style.gridTemplateColumns = "repeat(" + info.heads + ", max-content)";
      const cell = Math.max(1, Math.min(6, Math.floor(120 / Math.max(info.rows, info.cols))));
      for (let layer = 1; layer <= info.layers; layer++) {
        for (let head = 1; head <= info.heads; head++) {
          const wrap = document.createElement("div");
          wrap.className = "thumb-wrap";
          Object.assign(wrap.dataset, { kind: kind, layer: layer, head: head });
          const figure = new Figure(info.cols * cell, info.rows * cell);
          figure.heatmap(0, 0, cell, { rows: info.rows, cols: info.cols, values: probabilities(kind, layer, head),
            scale: "sequential", vmax: 1, quantity: "P" });
          const holder = document.createElement("div");
          const element = place(holder, figure, isLarge(info.rows, info.cols), "");
          element.classList.add("thumb");
          Object.assign(element.dataset, { kind: kind, layer: layer, head: head, rows: info.rows, cols: info.cols });
          wrap.appendChild(element);
          const caption = document.createElement("span");
          caption.textContent = "layer " + layer + ", head " + head;
          wrap.appendChild(caption);
          wrap.addEventListener("click", function () { select({ kind: kind, layer: layer, head: head }); });
          wrap.addEventListener("mousemove", function (event) {
            const box = element.getBoundingClientRect();
            const hit = figure.hit(event.clientX - box.left, event.clientY - box.top);
            if (hit) showTip(event, cellText(kind, layer, head, hit.r, hit.c));
          });
          wrap.addEventListener("mouseleave", hideTip);
          grid.appendChild(wrap);
        }
      }
      section.appendChild(grid);
      container.appendChild(section);
    });
  }
  function markOverview() {
    document.querySelectorAll(".thumb-wrap").forEach(function (wrap) {
      const on = wrap.dataset.kind === state.kind && Number(wrap.dataset.layer) === state.layer &&
        Number(wrap.dataset.head) === state.head;
      wrap.classList.toggle("selected", on);
    });
  }

  // ------------------------------------------------------------------ tooltip
  const tip = document.getElementById("tooltip");
  function showTip(event, text) {
    tip.textContent = text;
    tip.hidden = false;
    tip.style.left = (event.pageX + 14) + "px";
    tip.style.top = (event.pageY + 14) + "px";
  }
  function hideTip() { tip.hidden = true; }
  function cellText(kind, layer, head, r, c) {
    const i = r * data.kinds[kind].cols + c;
    const lines = [data.kinds[kind].name + ", layer " + layer + ", head " + head,
      "query " + (r + 1) + " " + JSON.stringify(rowLabels(kind)[r]) + " → key " + (c + 1) + " " +
      JSON.stringify(colLabels(kind)[c]), "P = " + fmt(probabilities(kind, layer, head)[i])];
    ["dP", "dS"].forEach(function (grad) {
      const values = gradient(grad, kind, layer, head, state.token);
      lines.push(GRADS[grad] + " = " + (values ? fmt(values[i]) : "not in this page") +
        (state.token ? " (of ℓ" + state.token + ")" : ""));
    });
    return lines.join("\n");
  }

  // ------------------------------------------------------------------ 2. one head
  let detailFigure = null;
  function detailLayout(forExport) {
    const kind = state.kind, info = data.kinds[kind];
    const cell = Math.max(3, Math.min(22, Math.floor(360 / Math.max(info.rows, info.cols))));
    const probs = probabilities(kind, state.layer, state.head);
    const grads = gradient(state.grad, kind, state.layer, state.head, state.token);
    const figure = new Figure(1, 1);
    const name = info.name + ", layer " + state.layer + ", head " + state.head;
    if (forExport) figure.text(4, 14, name + "; gradient of " + sourceName(state.token), { size: 12 });
    const top = forExport ? 22 : 0;
    const first = labelledHeatmap(figure, 4, top, { title: "P", rows: info.rows, cols: info.cols, values: probs,
      scale: "sequential", vmax: 1, quantity: "P", cell: cell, rowLabels: rowLabels(kind), colLabels: colLabels(kind) });
    let width = 4 + first.width, height = top + first.height;
    const heatmaps = [first.item];
    if (grads) {
      const vmax = maxAbs(grads) || 1;
      const second = labelledHeatmap(figure, width + 28, top, { title: GRADS[state.grad] + " of " +
        (state.token ? "ℓ" + state.token : "L") + " (±" + fmt(vmax) + ")", rows: info.rows, cols: info.cols,
        values: grads, scale: "diverging", vmax: vmax, quantity: "grad", cell: cell, rowLabels: null,
        colLabels: colLabels(kind) });
      width += 28 + second.width;
      height = Math.max(height, top + second.height);
      heatmaps.push(second.item);
    }
    if (state.row) { // the derivation's query row
      heatmaps.forEach(function (item) {
        figure.outline(item.x - 1, item.y + (state.row - 1) * cell - 1, item.cols * cell + 2, cell + 2, "#f28e2b");
      });
    }
    figure.width = Math.ceil(width + 8);
    figure.height = Math.ceil(height + 4);
    return figure;
  }
  function detail() {
    const info = data.kinds[state.kind];
    const grads = gradient(state.grad, state.kind, state.layer, state.head, state.token);
    document.getElementById("detail-note").textContent = info.name + ", layer " + state.layer + ", head " +
      state.head + ": rows are the queries (" + info.queries + "), columns the keys (" + info.keys + "). Left P; right " +
      GRADS[state.grad] + " of " + sourceName(state.token) + " on a diverging scale (blue negative, red positive)" +
      (state.grad === "dS" ? ", the softmax's backward dS = P∘(dP − rowsum(P∘dP)) from the hook point's P and dP;" +
        " every row sums to 0." : ", the gradient at the keep_attention hook point, dP = dO·Vᵀ.") +
      (grads ? "" : " The page does not hold this token's own dL/dP and dL/dS (see section 3).");
    const container = document.getElementById("detail");
    detailFigure = detailLayout(false);
    const element = place(container, detailFigure, isLarge(info.rows, info.cols), "");
    element.id = "detail-view";
    Object.assign(element.dataset, { kind: state.kind, layer: state.layer, head: state.head, grad: state.grad,
      token: state.token, rows: info.rows, cols: info.cols });
  }
  function detailEvents() {
    const container = document.getElementById("detail");
    function hitOf(event) {
      const view = document.getElementById("detail-view");
      if (!view || !detailFigure) return null;
      const box = view.getBoundingClientRect();
      return detailFigure.hit(event.clientX - box.left, event.clientY - box.top);
    }
    container.addEventListener("mousemove", function (event) {
      const hit = hitOf(event);
      if (hit) showTip(event, cellText(state.kind, state.layer, state.head, hit.r, hit.c));
      else hideTip();
    });
    container.addEventListener("mouseleave", hideTip);
    container.addEventListener("click", function (event) {
      const hit = hitOf(event);
      if (hit) select({ row: hit.r + 1 });
    });
  }

  // ------------------------------------------------------------------ 3. target tokens
  function tokens() {
    const container = document.getElementById("tokens");
    if (!container.childElementCount) {
      const add = function (t, label, loss) {
        const button = document.createElement("button");
        button.type = "button";
        button.className = "token" + (t && !(t in tokenIndex) ? " missing" : "");
        button.dataset.token = t;
        const name = document.createElement("span");
        name.textContent = label;
        const small = document.createElement("small");
        small.textContent = fmt(loss);
        button.append(name, small);
        if (t && !(t in tokenIndex)) button.title = "saliency and sensitivity only: this page does not hold this token's own dL/dP and dL/dS";
        button.addEventListener("click", function () { select({ token: t }); });
        container.appendChild(button);
      };
      add(0, "L (all)", view.loss.total);
      outputs.forEach(function (piece, i) { add(i + 1, piece, view.loss.tokens[i]); });
    }
    container.querySelectorAll("button.token").forEach(function (b) {
      b.setAttribute("aria-pressed", String(Number(b.dataset.token) === state.token));
    });
    const tg = view.token_gradients, check = tg.sum_check;
    const worst = Object.keys(check).reduce(function (m, k) {
      return Math.max(m, check[k].max_abs_difference / Math.max(check[k].max_abs, 1e-300));
    }, 0);
    document.getElementById("sum-check").textContent = "Σₜ ∂ℓₜ/∂X = ∂L/∂X for X = P, S of every head and the " +
      "embeddings, computed over all " + outputs.length + " tokens in float64: largest difference " +
      fmt(worst) + " of the largest |∂L/∂X|. " + (tg.complete ? "The page holds every token's dL/dP and dL/dS; " +
      "its self-test sums them again." : "The page holds the dL/dP and dL/dS of tokens " + tg.positions.join(", ") +
      " (of " + outputs.length + ": " + tg.values.toLocaleString("en") + " numbers, at most " +
      tg.limit.toLocaleString("en") + " in all; tinyformer explain --tokens picks others).") +
      " Each token's dℓₜ/dP is stored in one byte a value (within 4.4 %), its dℓₜ/dS computed here from it.";
  }

  // ------------------------------------------------------------------ 4. saliency
  function saliency() {
    const container = document.getElementById("saliency");
    container.textContent = "";
    ["source", "target"].forEach(function (side) {
      const labels = side === "source" ? pieces.source : pieces.target;
      const norm = state.token ? block("token.saliency." + side + ".norm", [state.token - 1])
        : block("saliency." + side + ".norm", []);
      const gxi = state.token ? block("token.saliency." + side + ".gxi", [state.token - 1])
        : block("saliency." + side + ".gxi", []);
      const step = Math.max(4, Math.min(24, Math.floor(900 / labels.length)));
      const left = 110, barHeight = 46, figure = new Figure(left + labels.length * step + 10, 2 * barHeight + 100);
      figure.text(0, 12, side + " tokens (" + (side === "source" ? "encoder input" : "decoder input") + ")",
        { size: 12, bold: true });
      const nmax = maxAbs(norm) || 1, gmax = maxAbs(gxi) || 1;
      figure.text(left - 6, 24 + barHeight / 2, "‖g‖ (max " + fmt(nmax) + ")", { size: 10, anchor: "end" });
      figure.text(left - 6, 30 + barHeight * 1.5, "g·e (±" + fmt(gmax) + ")", { size: 10, anchor: "end" });
      labels.forEach(function (label, i) {
        const x = left + i * step, h = norm[i] / nmax * barHeight;
        figure.rect(x + 1, 20 + barHeight - h, step - 2, h, "#5b4fa8", 'class="bar" data-side="' + side +
          '" data-measure="norm" data-i="' + i + '" data-v="' + norm[i] + '"');
        const g = gxi[i] / gmax * barHeight / 2, middle = 26 + barHeight * 1.5;
        figure.rect(x + 1, g >= 0 ? middle - g : middle, step - 2, Math.abs(g), g >= 0 ? "#b2182b" : "#2166ac",
          'class="bar" data-side="' + side + '" data-measure="gxi" data-i="' + i + '" data-v="' + gxi[i] + '"');
        if (step >= 7) figure.text(x + step * 0.7, 32 + 2 * barHeight, label, { size: Math.min(11, step - 1), rotate: true, anchor: "end" });
      });
      figure.rect(left, 26 + barHeight * 1.5, labels.length * step, 0.6, "#9aa3b5");
      const holder = document.createElement("div");
      holder.className = "figure";
      holder.innerHTML = figure.toSVG('class="saliency" data-side="' + side + '"');
      holder.addEventListener("mousemove", function (event) {
        const bar = event.target.closest("rect.bar");
        if (!bar) return hideTip();
        const i = Number(bar.dataset.i);
        showTip(event, side + " token " + (i + 1) + " " + JSON.stringify(labels[i]) + "\n‖g‖ = " + fmt(norm[i]) +
          "\ng·e = " + fmt(gxi[i]) + "\nof " + sourceName(state.token));
      });
      holder.addEventListener("mouseleave", hideTip);
      container.appendChild(holder);
    });
  }

  // ------------------------------------------------------------------ 5. sensitivity and rollout
  function sensitivities(token) {
    const rows = [];
    KINDS.forEach(function (kind) {
      const info = data.kinds[kind];
      const values = token ? block("token.sensitivity." + kind, [token - 1]) : block("sensitivity." + kind, []);
      for (let layer = 1; layer <= info.layers; layer++) {
        for (let head = 1; head <= info.heads; head++) {
          rows.push({ kind: kind, layer: layer, head: head, value: values[(layer - 1) * info.heads + head - 1] });
        }
      }
    });
    return rows.sort(function (a, b) { return Math.abs(b.value) - Math.abs(a.value); });
  }
  function sensitivity() {
    const rows = sensitivities(state.token);
    const largest = Math.abs(rows[0].value) || 1;
    const table = document.createElement("table");
    table.id = "sensitivity-table";
    table.innerHTML = "<thead><tr><th>rank</th><th class=\"text\">attention</th><th>layer</th><th>head</th>" +
      "<th>Σ P∘∂" + (state.token ? "ℓ" + state.token : "L") + "/∂P</th><th class=\"text\"></th></tr></thead>";
    const body = document.createElement("tbody");
    rows.forEach(function (row, rank) {
      const tr = document.createElement("tr");
      tr.className = "clickable" + (row.kind === state.kind && row.layer === state.layer && row.head === state.head ?
        " current" : "");
      Object.assign(tr.dataset, { kind: row.kind, layer: row.layer, head: row.head, v: row.value });
      const width = Math.max(1, Math.round(Math.abs(row.value) / largest * 160));
      tr.innerHTML = "<td>" + (rank + 1) + "</td><td class=\"text\">" + escapeText(data.kinds[row.kind].name) +
        "</td><td>" + row.layer + "</td><td>" + row.head + "</td><td>" + fmt(row.value) + "</td><td class=\"text\">" +
        '<svg width="162" height="10"><rect x="0" y="1" width="' + width + '" height="8" class="' +
        (row.value >= 0 ? "bar-pos" : "bar-neg") + '"></rect></svg></td>';
      tr.addEventListener("click", function () { select({ kind: row.kind, layer: row.layer, head: row.head }); });
      body.appendChild(tr);
    });
    table.appendChild(body);
    const container = document.getElementById("sensitivity");
    container.textContent = "";
    container.appendChild(table);
  }
  function rolloutPanel() {
    const container = document.getElementById("rollout");
    [["enc", "encoder rollout (source × source)"], ["dec", "decoder self-attention rollout (target × target)"],
      ["cross", "cross rollout (target × source)"]].forEach(function (entry) {
      const kind = entry[0], info = data.kinds[kind];
      const values = block("rollout." + kind, []);
      const cell = Math.max(2, Math.min(16, Math.floor(260 / Math.max(info.rows, info.cols))));
      const figure = new Figure(1, 1);
      const placed = labelledHeatmap(figure, 4, 0, { title: entry[1], rows: info.rows, cols: info.cols, values: values,
        scale: "sequential", vmax: maxAbs(values) || 1, quantity: "rollout", cell: cell, rowLabels: rowLabels(kind),
        colLabels: colLabels(kind) });
      figure.width = Math.ceil(placed.width + 12);
      figure.height = Math.ceil(placed.height + 4);
      const holder = document.createElement("div");
      holder.className = "figure";
      const element = place(holder, figure, isLarge(info.rows, info.cols), 'data-rollout="' + kind + '"');
      element.dataset.rollout = kind;
      holder.addEventListener("mousemove", function (event) {
        const box = element.getBoundingClientRect();
        const hit = figure.hit(event.clientX - box.left, event.clientY - box.top);
        if (!hit) return hideTip();
        showTip(event, entry[1] + "\n" + JSON.stringify(rowLabels(kind)[hit.r]) + " → " +
          JSON.stringify(colLabels(kind)[hit.c]) + ": " + fmt(values[hit.r * info.cols + hit.c]));
      });
      holder.addEventListener("mouseleave", hideTip);
      container.appendChild(holder);
    });
  }

  // ------------------------------------------------------------------ 6. gradient check
  function verdicts() {
    const c = view.check;
    return c.rows.map(function (row) {
      return Math.abs(row.analytic - row.numeric) <= c.atol + c.rtol * Math.abs(row.numeric);
    });
  }
  function gradientCheck() {
    const c = view.check, passed = verdicts();
    const all = passed.every(Boolean);
    const badge = document.getElementById("gradcheck-badge");
    badge.dataset.status = all ? "pass" : "fail";
    badge.textContent = all ? "PASS" : "FAIL: " + passed.filter(function (p) { return !p; }).length + " of " +
      passed.length;
    document.getElementById("check-note").textContent = "Central differences (L(x + ε) − L(x − ε)) / 2ε with ε = " +
      c.eps + " in float64, on this sentence: for each kind of attention two entries of P and two of S in its most " +
      "sensitive head (the largest |gradient| and a random one); the gate of the most sensitive head of all (" +
      data.kinds[c.head.kind].name + ", layer " + c.head.layer + ", head " + c.head.head + ") and two elements of " +
      "each of its W_Q, W_K and W_V rows. Moving P_ij by ε moves row i of the head's output O = P·V by ε·V_j; moving " +
      "S_ij by ε moves it by (softmax(S_i + ε e_j) − P_i)·V. Pass when |analytic − numeric| ≤ " + c.atol + " + " +
      c.rtol + "·|numeric| (tinyformer.study.gradcheck's rule).";
    const table = document.createElement("table");
    table.id = "check-table";
    table.innerHTML = "<thead><tr><th class=\"text\">what</th><th class=\"text\">attention</th><th>layer</th>" +
      "<th>head</th><th class=\"text\">index</th><th>analytic</th><th>numeric</th><th>abs error</th>" +
      "<th>rel error</th><th class=\"text\">result</th></tr></thead>";
    const body = document.createElement("tbody");
    c.rows.forEach(function (row, i) {
      const tr = document.createElement("tr");
      tr.className = passed[i] ? "" : "fail";
      tr.dataset.passed = String(passed[i]);
      tr.innerHTML = "<td class=\"text\">" + escapeText(row.what) + "</td><td class=\"text\">" +
        escapeText(data.kinds[row.kind].name) + "</td><td>" + row.layer + "</td><td>" + row.head +
        "</td><td class=\"text\">" + (row.index.length ? "[" + row.index.join(", ") + "]" : "ξ") + "</td><td>" +
        row.analytic.toExponential(9) + "</td><td>" + row.numeric.toExponential(9) + "</td><td>" +
        row.abs_error.toExponential(2) + "</td><td>" + row.rel_error.toExponential(2) + "</td><td class=\"text\">" +
        (passed[i] ? "pass" : "FAIL") + "</td>";
      body.appendChild(tr);
    });
    table.appendChild(body);
    document.getElementById("check").appendChild(table);
  }

  // ------------------------------------------------------------------ 7. the derivation
  function norm(values) {
    let s = 0;
    for (let i = 0; i < values.length; i++) s += values[i] * values[i];
    return Math.sqrt(s);
  }
  function vector(values) {
    return "[" + Array.prototype.map.call(values, fmt).join(", ") + "]";
  }
  function derivation() {
    const kind = state.kind, info = data.kinds[kind], l = state.layer - 1, h = state.head - 1;
    const dk = data.model.d_k;
    const dO = block("dO." + kind, [l, h]), V = block("V." + kind, [l, h]), Q = block("Q." + kind, [l, h]);
    const dQ = block("dQ." + kind, [l, h]), dK = block("dK." + kind, [l, h]), dV = block("dV." + kind, [l, h]);
    const P = probabilities(kind, state.layer, state.head);
    const dP = block("dP." + kind, [l, h]), dS = block("dS." + kind, [l, h]);
    const cols = info.cols, scale = 1 / Math.sqrt(dk);
    let row = state.row - 1;
    if (row < 0) { // the query whose scores get the most gradient
      let best = -1;
      for (let i = 0; i < info.rows; i++) {
        let n = 0;
        for (let j = 0; j < cols; j++) n += Math.abs(dS[i * cols + j]);
        if (n > best) { best = n; row = i; }
      }
    }
    let rowsum = 0;
    for (let j = 0; j < cols; j++) rowsum += P[row * cols + j] * dP[row * cols + j];
    const gaps = block("derivation." + kind, []);
    const gap = function (q) { return gaps[(q * info.layers + l) * info.heads + h]; };
    const keys = colLabels(kind);
    const visible = info.causal ? row + 1 : cols; // a causal row's later keys are masked: P = 0, so dS = 0
    const order = Array.from({ length: visible }, function (_, j) { return j; });
    const shown = visible > 24 ? order.sort(function (a, b) {
      return Math.abs(dS[row * cols + b]) - Math.abs(dS[row * cols + a]);
    }).slice(0, 24).sort(function (a, b) { return a - b; }) : order;
    let table = "<table id=\"derivation-table\"><thead><tr><th>j</th><th class=\"text\">key</th><th>P_ij</th>" +
      "<th>dP_ij = dO_i·V_j</th><th>P_ij·dP_ij</th><th>dS_ij = P_ij (dP_ij − r_i)</th><th>row i's share of " +
      "‖dV_j‖: ‖P_ij dO_i‖</th><th>of ‖dK_j‖: ‖dS_ij Q_i‖/√d_k</th></tr></thead><tbody>";
    let dsum = 0, qnorm = 0, onorm = 0;
    for (let d = 0; d < dk; d++) { qnorm += Q[row * dk + d] ** 2; onorm += dO[row * dk + d] ** 2; }
    for (let j = 0; j < cols; j++) dsum += dS[row * cols + j];
    shown.forEach(function (j) {
      const i = row * cols + j;
      table += "<tr data-j=\"" + (j + 1) + "\"><td>" + (j + 1) + "</td><td class=\"text\">" + escapeText(keys[j]) +
        "</td><td>" + fmt(P[i]) + "</td><td>" + fmt(dP[i]) + "</td><td>" + fmt(P[i] * dP[i]) + "</td><td>" +
        fmt(dS[i]) + "</td><td>" + fmt(Math.abs(P[i]) * Math.sqrt(onorm)) + "</td><td>" +
        fmt(Math.abs(dS[i]) * Math.sqrt(qnorm) * scale) + "</td></tr>";
    });
    table += "</tbody></table>";
    const name = info.name + ", layer " + state.layer + ", head " + state.head;
    const steps = [
      "<p class=\"derivation-step\">" + escapeText(name) + ", query row i = " + (row + 1) + " " +
        escapeText(JSON.stringify(rowLabels(kind)[row])) + ", the whole loss L" +
        (state.row ? "" : " (the row whose scores get the most gradient, Σ_j |dS_ij|; click a row of the heatmaps " +
        "for another)") + ".</p>",
      "<p class=\"derivation-step\"><span class=\"formula\">dO_i</span> = ∂L/∂O_i, the gradient at this row of the " +
        "head's output O = P·V (d_k = " + dk + "): <span class=\"vector\" id=\"derivation-dO\">" + vector(dO.subarray(row * dk, (row + 1) * dk)) + "</span></p>",
      "<p class=\"derivation-step\"><span class=\"formula\">r_i = Σ_j P_ij·dP_ij = " + fmt(rowsum) + "</span>; " +
        "<span class=\"formula\">Σ_j dS_ij = " + fmt(dsum) + "</span> (a softmax row's gradient sums to 0)" +
        (info.causal && visible < cols ? "; keys after i are masked (P_ij = 0, so dS_ij = 0 whatever dP_ij)" : "") +
        (shown.length < visible ? "; the " + shown.length + " keys of largest |dS_ij| of " + visible + ":" : ":") +
        "</p>",
      table,
      "<p class=\"derivation-step\"><span class=\"formula\">dQ_i = Σ_j dS_ij K_j / √d_k</span> = " +
        "<span class=\"vector\" id=\"derivation-dQ\">" + vector(dQ.subarray(row * dk, (row + 1) * dk)) + "</span></p>",
      "<p class=\"derivation-step\"><span class=\"formula\">dK = dSᵀ·Q/√d_k</span> and <span class=\"formula\">" +
        "dV = Pᵀ·dO</span> sum every query row's share: ‖dK‖ = " + fmt(norm(dK)) + ", ‖dV‖ = " +
        fmt(norm(dV)) + " for this head.</p>",
      "<p class=\"derivation-step\" id=\"derivation-gaps\">The engine's dQ, dK, dV (autograd through the fused " +
        "attention backward) against the formulas from the hook point's P and dP, largest difference over this head " +
        "(float64, in Python): dV " + fmt(gap(0)) + ", dP = dO·Vᵀ " + fmt(gap(1)) + ", dQ " + fmt(gap(2)) + ", dK " +
        fmt(gap(3)) + ".</p>",
    ];
    document.getElementById("derivation").innerHTML = steps.join("");
  }

  // ------------------------------------------------------------------ export of the current view
  function exportName(suffix) {
    return "tinyformer-explain-" + state.kind + "-layer" + state.layer + "-head" + state.head + "-" + state.grad +
      (state.token ? "-token" + state.token : "") + "." + suffix;
  }
  function exportSVG() {
    const holder = document.createElement("div");
    holder.innerHTML = detailLayout(true).toSVG('class="heatmap export"');
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + new XMLSerializer().serializeToString(holder.firstElementChild);
  }
  function exportCanvas() {
    const canvas = document.createElement("canvas");
    detailLayout(true).draw(canvas);
    return canvas;
  }
  function download(blob, name) {
    const link = document.createElement("a");
    link.href = URL.createObjectURL(blob);
    link.download = name;
    document.body.appendChild(link);
    link.click();
    link.remove();
    setTimeout(function () { URL.revokeObjectURL(link.href); }, 1000);
  }

  // ------------------------------------------------------------------ self-test
  // Error bounds: how far each of the page's numbers may be from the exact one, given the most that
  // storage moved its inputs (decodeArray's error), to first order and beyond (|xy − x̃ỹ| ≤
  // |x̃|e_y + |ỹ|e_x + e_x·e_y), with 2⁻⁴⁰ of the terms' size for float64 arithmetic on both sides.
  const EPS = Math.pow(2, -53), SLACK = Math.pow(2, -40);
  function probabilityError(kind, l, h) { // P̂ = P̃/s, s = Σ_k P̃_k; the true row sums to 1
    return cached("eP." + kind + "." + l + "." + h, function () {
      const info = data.kinds[kind], raw = stored("P." + kind, [l, h]), e = storedError("P." + kind, [l, h]);
      const out = new Float64Array(raw.length), cols = info.cols;
      for (let i = 0; i < info.rows; i++) {
        let s = 0, spread = 0;
        for (let j = 0; j < cols; j++) { s += raw[i * cols + j]; spread += e[i * cols + j]; }
        for (let j = 0; j < cols; j++) {
          const k = i * cols + j;
          out[k] = s > 0 ? (e[k] + (Math.abs(raw[k]) + e[k]) * spread) / s + SLACK * Math.abs(raw[k]) : e[k];
        }
      }
      return out;
    });
  }
  // Σ_k a_k·b_k's bound, for a (n × d) row i and b (m × d) row j, strides given.
  function dotError(a, ea, b, eb, length, ai, as, bi, bs) {
    let bound = 0, size = 0;
    for (let k = 0; k < length; k++) {
      const x = a[ai + k * as], y = b[bi + k * bs], ex = ea[ai + k * as], ey = eb[bi + k * bs];
      bound += Math.abs(x) * ey + Math.abs(y) * ex + ex * ey;
      size += Math.abs(x * y);
    }
    return bound + SLACK * size;
  }
  function softmaxBackwardError(P, eP, dP, edP, rows, cols) {
    const out = new Float64Array(rows * cols);
    for (let i = 0; i < rows; i++) {
      const o = i * cols;
      let m = 0;
      for (let j = 1; j < cols; j++) if (P[o + j] > P[o + m]) m = j;
      let r = 0, er = 0, size = 0;
      for (let j = 0; j < cols; j++) {
        const c = dP[o + j] - dP[o + m], ec = j === m ? 0 : edP[o + j] + edP[o + m];
        r += P[o + j] * c;
        er += eP[o + j] * Math.abs(c) + (P[o + j] + eP[o + j]) * ec;
        size += Math.abs(P[o + j] * c);
      }
      for (let j = 0; j < cols; j++) {
        const c = dP[o + j] - dP[o + m], ec = j === m ? 0 : edP[o + j] + edP[o + m];
        out[o + j] = eP[o + j] * Math.abs(c - r) + (P[o + j] + eP[o + j]) * (ec + er) +
          SLACK * (P[o + j] * (Math.abs(c) + size) + Math.abs(P[o + j] * c));
      }
    }
    return out;
  }
  // One query row i of the bound of the page's dP, dS or token.dS (with `ti`) at a head (cols numbers).
  function errorRow(quantity, kind, ti, l, h, i) {
    return cached("e" + quantity + "." + kind + "." + ti + "." + l + "." + h + "." + i, function () {
      const info = data.kinds[kind], cols = info.cols, dk = data.model.d_k;
      if (quantity === "dP") {
        const dO = stored("dO." + kind, [l, h]), eO = storedError("dO." + kind, [l, h]);
        const V = stored("V." + kind, [l, h]), eV = storedError("V." + kind, [l, h]);
        const out = new Float64Array(cols);
        for (let j = 0; j < cols; j++) out[j] = dotError(dO, eO, V, eV, dk, i * dk, 1, j * dk, 1);
        return out;
      }
      const P = probabilitiesOf(kind, l, h), eP = probabilityError(kind, l, h);
      const token = quantity === "token.dS";
      const dP = token ? stored("token.dP." + kind, [ti, l, h]) : headGradient("dP", kind, l, h);
      const edP = token ? storedError("token.dP." + kind, [ti, l, h]).subarray(i * cols, (i + 1) * cols)
        : errorRow("dP", kind, 0, l, h, i);
      return softmaxBackwardError(P.subarray(i * cols, (i + 1) * cols), eP.subarray(i * cols, (i + 1) * cols),
        dP.subarray(i * cols, (i + 1) * cols), edP, 1, cols);
    });
  }
  // The bound of a whole head (rows × cols) of dP, dS or token.dS.
  function errorOf(quantity, kind, ti, l, h) {
    const info = data.kinds[kind], out = new Float64Array(info.rows * info.cols);
    for (let i = 0; i < info.rows; i++) out.set(errorRow(quantity, kind, ti, l, h, i), i * info.cols);
    return out;
  }
  // The bound of one entry of the page's dQ (at query row r), dK or dV (at key row r), column d.
  function projectionError(quantity, kind, l, h, r, d) {
    const info = data.kinds[kind], rows = info.rows, cols = info.cols, dk = data.model.d_k, scale = 1 / Math.sqrt(dk);
    if (quantity === "dV") {
      return dotError(probabilitiesOf(kind, l, h), probabilityError(kind, l, h), stored("dO." + kind, [l, h]),
        storedError("dO." + kind, [l, h]), rows, r, cols, d, dk);
    }
    const dS = headGradient("dS", kind, l, h);
    if (quantity === "dQ") {
      return scale * dotError(dS.subarray(r * cols, (r + 1) * cols), errorRow("dS", kind, 0, l, h, r),
        stored("K." + kind, [l, h]), storedError("K." + kind, [l, h]), cols, 0, 1, d, dk);
    }
    return scale * dotError(dS, errorOf("dS", kind, 0, l, h), stored("Q." + kind, [l, h]),
      storedError("Q." + kind, [l, h]), rows, r, cols, d, dk);
  }
  // The page's value of a sample (view.samples[name], a flat index into the Python side's array) and its bound.
  function sampleOf(name, flat) {
    const parts = name.split("."), token = parts[0] === "token", quantity = token ? "token." + parts[1] : parts[0];
    const kind = parts[parts.length - 1], info = data.kinds[kind], dk = data.model.d_k;
    const inner = quantity === "dQ" ? info.rows * dk : quantity === "dK" || quantity === "dV" ? info.cols * dk : info.rows * info.cols;
    let head = Math.floor(flat / inner);
    const at = flat % inner, h = head % info.heads;
    head = Math.floor(head / info.heads);
    const l = head % info.layers, ti = Math.floor(head / info.layers);
    const values = token ? tokenGradient(parts[1], kind, ti, l, h) : headGradient(quantity, kind, l, h);
    const bound = quantity === "dQ" || quantity === "dK" || quantity === "dV"
      ? projectionError(quantity, kind, l, h, Math.floor(at / dk), at % dk)
      : errorRow(quantity, kind, ti, l, h, Math.floor(at / info.cols))[at % info.cols];
    return { value: values[at], bound: bound };
  }
  // Every check of the numbers of the step shown, reported through `check(name, passed, detail)`.
  function stepChecks(check) {
    let rowSum = 0, scoreSum = 0, above = 0, tokenSum = 0;
    const held = tokenPositions.length;
    KINDS.forEach(function (kind) {
      const info = data.kinds[kind], rows = info.rows, cols = info.cols;
      for (let l = 0; l < info.layers; l++) {
        for (let h = 0; h < info.heads; h++) {
          const raw = stored("P." + kind, [l, h]), e = storedError("P." + kind, [l, h]), P = probabilitiesOf(kind, l, h);
          const scores = [headGradient("dS", kind, l, h), headGradient("dP", kind, l, h)];
          for (let t = 0; t < held; t++) scores.push(tokenGradient("dS", kind, t, l, h), tokenGradient("dP", kind, t, l, h));
          for (let i = 0; i < rows; i++) {
            let s = 0, spread = 0;
            for (let j = 0; j < cols; j++) {
              s += raw[i * cols + j];
              spread += e[i * cols + j];
              if (info.causal && j > i && P[i * cols + j] !== 0) above++;
            }
            rowSum = Math.max(rowSum, Math.abs(s - 1) / spread); // the stored row sums to 1 within its precision
            // Each row of the page's dS sums to 0 to float64 rounding of its own terms, judged by their
            // size computed here again (centred, as the formula must be for saturated rows).
            for (let g = 0; g < scores.length; g += 2) {
              const dS = scores[g], dP = scores[g + 1];
              let m = 0, sum = 0, r = 0, size = 0;
              for (let j = 1; j < cols; j++) if (P[i * cols + j] > P[i * cols + m]) m = j;
              for (let j = 0; j < cols; j++) {
                const c = dP[i * cols + j] - dP[i * cols + m];
                r += P[i * cols + j] * c;
                size += Math.abs(P[i * cols + j] * c);
                sum += dS[i * cols + j];
                if (info.causal && j > i && dS[i * cols + j] !== 0) above++;
              }
              const limit = (4 * cols + 4) * EPS * (size + Math.abs(r));
              scoreSum = Math.max(scoreSum, sum === 0 ? 0 : Math.abs(sum) / limit);
            }
          }
          if (view.token_gradients.complete) { // Σₜ dℓₜ/dX = dL/dX, within the bounds of both sides
            ["dP", "dS"].forEach(function (grad) {
              const whole = headGradient(grad, kind, l, h), bound = errorOf(grad, kind, 0, l, h);
              const sum = new Float64Array(whole.length), allowed = new Float64Array(bound);
              for (let t = 0; t < held; t++) {
                const part = tokenGradient(grad, kind, t, l, h);
                const e = grad === "dP" ? storedError("token.dP." + kind, [t, l, h]) : errorOf("token.dS", kind, t, l, h);
                for (let k = 0; k < part.length; k++) { sum[k] += part[k]; allowed[k] += e[k]; }
              }
              for (let k = 0; k < sum.length; k++) {
                const gap = Math.abs(sum[k] - whole[k]);
                if (gap > 0) tokenSum = Math.max(tokenSum, gap / (allowed[k] + SLACK * Math.abs(whole[k])));
              }
            });
          }
        }
      }
    });
    check("P rows sum to 1", rowSum <= 1, "largest |Σ_j P_ij − 1| / Σ_j e_ij = " + fmt(rowSum) +
      " (passes up to 1; e_ij the most float16 storage moves P_ij)");
    check("dL/dS rows sum to 0", scoreSum <= 1, "largest |Σ_j dS_ij| / ((4n + 4)·2⁻⁵³·(Σ_j |P_ij (dP_ij − dP_im)| + " +
      "|r_i|)) = " + fmt(scoreSum) + " (passes up to 1: float64 rounding of the row's own terms, whole loss and " +
      "every held token)");
    check("causal: decoder self-attention P and dL/dS are 0 above the diagonal", above === 0, above + " entries");
    if (view.token_gradients.complete) {
      check("Σ over tokens of the per-token dL/dP, dL/dS = the whole loss's", tokenSum <= 1, "largest |Σₜ − whole| / " +
        "its bound = " + fmt(tokenSum) + " (passes up to 1; the bound adds what storage allows each side)");
    }
    let worstRatio = 0, worstGap = 0, where = "", count = 0;
    Object.keys(view.samples).forEach(function (name) {
      const sample = view.samples[name];
      sample.index.forEach(function (flat, k) {
        const found = sampleOf(name, flat), gap = Math.abs(found.value - sample.value[k]);
        const ratio = gap === 0 ? 0 : gap / found.bound;
        count++;
        if (!(ratio <= worstRatio)) { worstRatio = ratio; where = name + "[" + flat + "]"; }
        worstGap = Math.max(worstGap, gap);
      });
    });
    check("this page's dP, dS, dQ, dK, dV and per-token dS against Python's float64", worstRatio <= 1, count +
      " entries: largest |page − float64| " + fmt(worstGap) + "; largest share of its bound " + fmt(worstRatio) +
      (where ? " (" + where + ")" : "") + "; passes up to 1");
    const tg = view.token_gradients;
    const python = Object.keys(tg.sum_check).every(function (k) {
      return tg.sum_check[k].max_abs_difference <= 1e-8 * Math.max(1, tg.sum_check[k].max_abs);
    });
    check("Python's float64 Σₜ check over all tokens", python, JSON.stringify(tg.sum_check));
    const passed = verdicts();
    check("gradient-check verdicts agree with the Python side", passed.every(function (p, i) {
      return p === view.check.rows[i].passed;
    }) && passed.every(Boolean) === view.check.passed, "");
  }
  function selfTest() {
    const checks = [];
    // With several steps, a check passes when it passes at every step; its detail says each step's.
    const check = function (name, passed, detail) {
      const text = STEPS.length > 1 ? "step " + view.step + ": " + detail : detail;
      const found = checks.filter(function (c) { return c.name === name; })[0];
      if (found) {
        found.passed = found.passed && Boolean(passed);
        found.detail += " | " + text;
      } else {
        checks.push({ name: name, passed: Boolean(passed), detail: text });
      }
    };
    check("schema", data.schema === "tinyformer-explain" && data.version === 2, data.schema + " " + data.version);
    const shown = current;
    for (let k = 0; k < STEPS.length; k++) {
      useStep(k);
      stepChecks(check);
    }
    useStep(shown);
    let cellsOk = true;
    const cells = {};
    KINDS.forEach(function (kind) {
      const info = data.kinds[kind];
      const thumbs = document.querySelectorAll('.thumb[data-kind="' + kind + '"]');
      let count = 0;
      thumbs.forEach(function (t) {
        count += t.tagName.toLowerCase() === "svg" ? t.querySelectorAll("rect.cell").length : Number(t.dataset.rows) * Number(t.dataset.cols);
      });
      cells[kind] = count;
      cellsOk = cellsOk && thumbs.length === info.layers * info.heads && count === info.layers * info.heads * info.rows * info.cols;
    });
    check("every layer and head drawn", cellsOk, JSON.stringify(cells));
    if (STEPS.length > 1) sliderCheck(check);
    const svg = exportSVG();
    const info = data.kinds[state.kind];
    const expected = info.rows * info.cols * (gradient(state.grad, state.kind, state.layer, state.head, state.token) ? 2 : 1);
    const exported = (svg.match(/class="cell"/g) || []).length;
    check("SVG export of this view", svg.indexOf("<svg") >= 0 && svg.indexOf("xmlns=") >= 0 && exported === expected,
      exported + " cells, " + svg.length + " characters");
    const png = exportCanvas().toDataURL("image/png");
    check("PNG export of this view", png.indexOf("data:image/png;base64,") === 0 && png.length > 100, png.length + " characters");
    const digest = {};
    const sums = function (values) {
      let s = 0, a = 0;
      for (let i = 0; i < values.length; i++) { s += values[i]; a += Math.abs(values[i]); }
      return [s, a];
    };
    Object.keys(arrays).forEach(function (name) { digest[name] = sums(arrays[name].values); });
    KINDS.forEach(function (kind) {
      ["P", "dP", "dS", "dQ", "dK", "dV", "token.dP", "token.dS"].forEach(function (name) {
        digest["page:" + name + "." + kind] = sums(whole(name + "." + kind));
      });
    });
    const errors = window.explainErrors || [];
    const ok = checks.every(function (c) { return c.passed; }) && errors.length === 0;
    const status = document.getElementById("self-test");
    status.setAttribute("data-checks", JSON.stringify(checks));
    status.setAttribute("data-errors", JSON.stringify(errors));
    status.setAttribute("data-digest", JSON.stringify(digest));
    status.setAttribute("data-cells", JSON.stringify(cells));
    status.setAttribute("data-ms", String(Math.round(performance.now() - started)));
    status.setAttribute("data-status", ok ? "pass" : "fail");
    status.textContent = ok ? "pass (" + checks.length + " checks)" : "failed: " + checks.filter(function (c) {
      return !c.passed;
    }).map(function (c) { return c.name + " (" + c.detail + ")"; }).concat(errors).join("; ");
  }

  // ------------------------------------------------------------------ 0. across training
  function stepSlider() {
    if (STEPS.length < 2) return;
    const slider = document.getElementById("step-slider");
    document.getElementById("step-field").hidden = false;
    document.getElementById("steps-section").hidden = false;
    slider.max = String(STEPS.length - 1);
    slider.value = String(current);
    slider.addEventListener("input", function () { setStep(Number(slider.value)); });
    document.addEventListener("keydown", function (event) { // ← → anywhere but in a form control
      const tag = (event.target && event.target.tagName || "").toLowerCase();
      if (tag === "input" || tag === "select" || tag === "textarea" || event.altKey || event.ctrlKey || event.metaKey) return;
      const k = event.key === "ArrowLeft" ? current - 1 : event.key === "ArrowRight" ? current + 1 : -1;
      if (k >= 0 && k < STEPS.length) {
        event.preventDefault();
        setStep(k);
      }
    });
    document.getElementById("steps-chart").addEventListener("click", function (event) {
      const k = event.target.getAttribute && event.target.getAttribute("data-index");
      if (k !== null && k !== undefined) setStep(Number(k));
    });
  }
  // Every panel follows the step: what depends on it is drawn again.
  function setStep(k) {
    useStep(k);
    stepPanels();
    writeHash();
    update();
  }
  function stepPanels() {
    if (STEPS.length < 2) return;
    document.getElementById("step-slider").value = String(current);
    document.getElementById("step-label").textContent = "step " + view.step + " (" + (current + 1) + " of " +
      STEPS.length + ")";
    document.body.dataset.step = String(view.step);
    summary();
    ["overview", "rollout", "check", "tokens"].forEach(function (id) { document.getElementById(id).textContent = ""; });
    overview();
    rolloutPanel();
    gradientCheck();
  }
  const stepSensitivity = {}; // "k.kind": (layers·heads) of step k, decoded apart from its other arrays
  function sensitivityAt(k, kind) {
    const key = k + "." + kind;
    if (!stepSensitivity[key]) {
      const entry = STEPS[k].arrays["sensitivity." + kind];
      stepSensitivity[key] = decodeArray(entry, tokenPositions, bytesOf(entry)).values;
    }
    return stepSensitivity[key];
  }
  function stepChart() {
    if (STEPS.length < 2) return;
    const width = 330, height = 150, left = 52, right = 10, top = 18, bottom = 30;
    const steps = STEPS.map(function (s) { return s.step; });
    const x0 = Math.min.apply(null, steps), x1 = Math.max.apply(null, steps);
    const x = function (v) { return left + (x1 > x0 ? (v - x0) / (x1 - x0) : 0.5) * (width - left - right); };
    const plot = function (title, series, selected) {
      let lo = Infinity, hi = -Infinity;
      series.forEach(function (line) { line.forEach(function (v) { lo = Math.min(lo, v); hi = Math.max(hi, v); }); });
      if (!(hi > lo)) { hi = lo + 1; lo -= 1; }
      const y = function (v) { return top + (hi - v) / (hi - lo) * (height - top - bottom); };
      let svg = '<svg class="step-chart" width="' + width + '" height="' + height +
        '"><text x="' + left + '" y="12" font-size="12">' + escapeText(title) + "</text>" +
        '<line x1="' + x(steps[current]) + '" x2="' + x(steps[current]) + '" y1="' + top + '" y2="' + (height - bottom) +
        '" stroke="#f28e2b" stroke-width="2"/>' +
        '<text x="' + (left - 4) + '" y="' + (top + 4) + '" font-size="10" text-anchor="end">' + fmt(hi) + "</text>" +
        '<text x="' + (left - 4) + '" y="' + (height - bottom) + '" font-size="10" text-anchor="end">' + fmt(lo) + "</text>" +
        '<text x="' + left + '" y="' + (height - 8) + '" font-size="10">step ' + x0 + "</text>" +
        '<text x="' + (width - right) + '" y="' + (height - 8) + '" font-size="10" text-anchor="end">' + x1 + "</text>";
      series.forEach(function (line, i) {
        const dark = i === selected;
        svg += '<polyline fill="none" stroke="' + (dark ? "#3155c4" : "#c3cad8") + '" stroke-width="' + (dark ? 2 : 1) +
          '" points="' + line.map(function (v, k) { return x(steps[k]) + "," + y(v); }).join(" ") + '"/>';
      });
      const line = series[selected];
      line.forEach(function (v, k) {
        svg += '<circle class="step-point" data-index="' + k + '" cx="' + x(steps[k]) + '" cy="' + y(v) + '" r="' +
          (k === current ? 5 : 3.5) + '" fill="' + (k === current ? "#f28e2b" : "#3155c4") + '"><title>step ' + steps[k] +
          ": " + fmt(v) + "</title></circle>";
      });
      return svg + "</svg>";
    };
    const info = data.kinds[state.kind], heads = [];
    for (let i = 0; i < info.layers * info.heads; i++) {
      heads.push(STEPS.map(function (_, k) { return sensitivityAt(k, state.kind)[i]; }));
    }
    document.getElementById("steps-chart").innerHTML =
      plot("loss L", [STEPS.map(function (s) { return s.loss.total; })], 0) +
      plot("sensitivity per head (" + state.kind + "), layer " + state.layer + " head " + state.head, heads,
        (state.layer - 1) * info.heads + state.head - 1);
  }

  // The slider and the arrow keys move every panel: ← or → (a key event, as a reader's) shows the
  // next step, and each panel's drawing (its markup, and its canvases' pixels) changes; the slider's
  // input event brings every panel back as it was.
  const PANELS = ["summary", "overview", "detail", "tokens", "saliency", "sensitivity", "rollout", "check",
    "derivation", "steps-chart"];
  function panelDrawings() {
    const drawn = {};
    PANELS.forEach(function (id) {
      const element = document.getElementById(id);
      drawn[id] = element.innerHTML + Array.prototype.map.call(element.querySelectorAll("canvas"), function (c) {
        return c.toDataURL();
      }).join("");
    });
    return drawn;
  }
  function sliderCheck(check) {
    const shown = current, next = current > 0 ? current - 1 : current + 1, before = panelDrawings();
    document.dispatchEvent(new KeyboardEvent("keydown", { key: next < shown ? "ArrowLeft" : "ArrowRight", bubbles: true }));
    const moved = current === next, after = panelDrawings();
    const still = PANELS.filter(function (id) { return before[id] === after[id]; });
    const slider = document.getElementById("step-slider");
    slider.value = String(shown);
    slider.dispatchEvent(new Event("input", { bubbles: true }));
    const back = panelDrawings();
    const differ = PANELS.filter(function (id) { return before[id] !== back[id]; });
    check("the step slider and ← → move every panel", moved && still.length === 0 && current === shown &&
      differ.length === 0, "← / → to step " + STEPS[next].step + ": " + (moved ? "moved" : "did not move") +
      (still.length ? "; unchanged: " + still.join(", ") : "; every panel changed") + "; the slider back to step " +
      STEPS[shown].step + (differ.length ? ": not as before: " + differ.join(", ") : ": every panel as before"));
  }

  // ------------------------------------------------------------------ start
  function update() {
    stepChart();
    controls();
    markOverview();
    detail();
    tokens();
    saliency();
    sensitivity();
    derivation();
  }
  function start() {
  readHash();
  if (wantedStep !== current) useStep(wantedStep);
  header();
  if (STEPS.length > 1) {
    stepSlider();
    stepPanels();
  } else {
    overview();
    rolloutPanel();
    gradientCheck();
  }
  detailEvents();
  update();
  window.addEventListener("hashchange", function () {
    readHash();
    if (wantedStep !== current) setStep(wantedStep);
    else update();
  });
  const drawn = performance.now(), status = document.getElementById("self-test");
  status.setAttribute("data-drawn-ms", String(Math.round(drawn - started))); // every panel drawn
  if (window.PerformanceObserver) { // the browser's first paint, when it reports one
    new PerformanceObserver(function (list) {
      list.getEntries().forEach(function (entry) {
        if (entry.name === "first-contentful-paint") status.setAttribute("data-first-paint-ms", String(Math.round(entry.startTime)));
      });
    }).observe({ type: "paint", buffered: true });
  }
  // The checks take longer than the drawing: they run after the first paint (a frame's callback
  // runs before its paint; a task it queues, after), or after a second if no frame comes.
  let checked = false;
  const check = function () { if (!checked) { checked = true; selfTest(); } };
  requestAnimationFrame(function () { setTimeout(check, 0); });
  setTimeout(check, 1000);
  }
  useStep(current);
  const decoded = performance.now();
  start();
  document.getElementById("self-test").setAttribute("data-decoded-ms", String(Math.round(decoded - started)));
})();
